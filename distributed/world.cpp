#include "distributed/world.hpp"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef FLOWTRAIN_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>

#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "distributed/liveness.hpp"
#include "graph/read_file.hpp"

namespace flowtrain::dist {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr int kDefaultPort = 29500;  // torchrun's

std::unique_ptr<World> g_world;

std::string seconds_text(milliseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", static_cast<double>(d.count()) / 1000);
  return buf;
}

// The first line of an exception's message (c10::Error appends a C++ backtrace).
std::string one_line(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  const std::string message = c10_error ? c10_error->what_without_backtrace() : e.what();
  return message.substr(0, message.find('\n'));
}

// Bounds how long this process's connections to the store (those whose peer listens on `port`)
// wait for the store's machine to acknowledge what they sent (TCP_USER_TIMEOUT): past it the
// operation fails. Without it a cut link, or a machine gone without closing its connections,
// leaves a store read waiting on the kernel's retransmissions for about 15 minutes. TCPStore
// does not expose its sockets, so they are found among the process's open files.
void bound_unacknowledged(std::uint16_t port, milliseconds timeout) {
  const unsigned int ms = static_cast<unsigned int>(
      std::min<std::int64_t>(timeout.count(), std::numeric_limits<unsigned int>::max()));
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    int fd = -1;
    const std::string name = entry.path().filename().string();
    if (std::from_chars(name.data(), name.data() + name.size(), fd).ec != std::errc()) continue;
    sockaddr_storage peer{};
    socklen_t size = sizeof peer;
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &size) != 0) continue;
    const std::uint16_t peer_port =
        peer.ss_family == AF_INET    ? ntohs(reinterpret_cast<sockaddr_in&>(peer).sin_port)
        : peer.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6&>(peer).sin6_port)
                                     : 0;
    if (peer_port == port) ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, sizeof ms);
  }
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  const std::size_t shown = std::min<std::size_t>(ranks.size(), 8);
  for (std::size_t i = 0; i < shown; ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  if (ranks.size() > shown) out += " and " + std::to_string(ranks.size() - shown) + " more";
  return out;
}

// What reduces GPU tensors (CPU tensors always go through Gloo).
std::string resolve_backend(const std::string& asked) {
#ifdef FLOWTRAIN_WITH_CUDA
  const bool nccl = true;
#else
  const bool nccl = false;
#endif
  if (asked == "gloo") return "gloo";
  if (asked == "auto") return nccl ? "nccl" : "gloo";
  if (asked == "nccl") {
    if (!nccl) {
      throw Error(
          "backend 'nccl' needs a LibTorch built with CUDA, and this flowtrain was built against "
          "a CPU-only one: use backend 'gloo'");
    }
    return "nccl";
  }
  throw Error("unknown backend '" + asked + "': use auto, gloo or nccl");
}

// The network device Gloo binds to: GLOO_SOCKET_IFNAME if set (as in PyTorch), loopback for a
// job on this machine, else the address this machine's host name resolves to.
std::shared_ptr<::gloo::transport::Device> gloo_device(const std::string& master_addr) {
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname) {
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  }
  if (master_addr == "localhost" || master_addr.rfind("127.", 0) == 0) {
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  }
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

}  // namespace

struct World::Impl {
  int rank = 0;
  int size = 1;
  std::string host;
  int port = kDefaultPort;
  bool agent_store = false;  // torchrun's agent hosts the store: every rank is a client
  int restart = 0;           // torchrun's restarts of the group: whose keys are this attempt's
  std::string backend;
  milliseconds timeout{300000};
  c10::intrusive_ptr<c10d::Store> store;
  // A second connection for the heartbeat thread and diagnose(), so that neither waits behind
  // a long operation on the main one.
  c10::intrusive_ptr<c10d::Store> monitor;
  mutable std::mutex monitor_mutex;
  c10::intrusive_ptr<Group> group;
  c10::intrusive_ptr<Group> gpu_group;  // NCCL, on the first group_for a GPU
  std::map<std::vector<int>, c10::intrusive_ptr<Group>> subgroups;
  int sequence = 0;  // of barriers and gathers, which every rank calls in the same order
  std::atomic<int> phases_finished{0};  // finished_phase() calls: the phase this rank is in
  StopVote stop_vote;

  std::optional<HeartbeatThread> heartbeats;

  ~Impl() {
    heartbeats.reset();
    subgroups.clear();
    gpu_group.reset();
    group.reset();
    monitor.reset();
    store.reset();  // on rank 0, the store's server goes last
  }

  std::string address() const { return host + ":" + std::to_string(port); }
  // Who hosts the store, and what its loss means.
  std::string store_host() const { return agent_store ? "torchrun's agent" : "rank 0"; }
  std::string store_gone() const {
    return agent_store ? "torchrun's agent exited, or its machine is down or unreachable"
                       : "rank 0 exited, was killed, or its machine is down";
  }

  void connect() {
    c10d::TCPStoreOptions options;
    options.port = static_cast<std::uint16_t>(port);
    options.isServer = rank == 0 && !agent_store;
    options.numWorkers = size;
    // The rendezvous below counts arrivals itself, to name the ranks that are late.
    options.waitWorkers = false;
    options.timeout = timeout;
    // c10d also logs a failed connection to stderr; the error below says it in one line.
    // (GLOG_minloglevel=0, or with LibTorch 2.x TORCH_CPP_LOG_LEVEL=INFO, keeps its logs.)
    const QuietTorchLog quiet;
    try {
      store = c10::make_intrusive<c10d::TCPStore>(host, options);
      options.isServer = false;
      options.numWorkers = {};
      monitor = c10::make_intrusive<c10d::TCPStore>(host, options);
      bound_unacknowledged(options.port, timeout);
      if (agent_store) {
        // The agent's store outlives a restart of the group (torchrun --max_restarts): each
        // attempt's keys apart, under PyTorch's own prefix for its workers.
        const std::string attempt = "/worker/attempt_" + std::to_string(restart);
        store = c10::make_intrusive<c10d::PrefixStore>(attempt, store);
        monitor = c10::make_intrusive<c10d::PrefixStore>(attempt, monitor);
      }
    } catch (const std::exception& e) {
      if (options.isServer && !store) {
        throw WorldError("rank 0 cannot host the rendezvous store on port " + std::to_string(port) +
                         " (" + one_line(e) +
                         "): is another job using it? choose another MASTER_PORT");
      }
      throw WorldError("rank " + std::to_string(rank) + " cannot reach the rendezvous store at " +
                       address() + " within " + seconds_text(timeout) + " (" + one_line(e) +
                       "): is rank 0 running, and are MASTER_ADDR and MASTER_PORT right?");
    }
  }

  // Sets `prefix/<rank>` to `value`, counts this rank in, and (with `wait`) waits until every
  // rank did. Names the missing ranks on a timeout; with `watch`, fails as soon as a missing
  // rank reported a failure or its heartbeat stopped.
  void meet(const std::string& what,
            const std::string& prefix,
            const std::string& value,
            bool wait,
            bool watch) {
    try {
      store->set(rank_key(prefix, rank), store_bytes(value));
      store->add(prefix + "/count", 1);
      if (wait) wait_for_all(what, prefix, watch);
    } catch (const WorldError&) {
      throw;
    } catch (const std::exception& e) {
      throw store_lost(what, e);
    }
  }

  WorldError store_lost(std::string_view what, const std::exception& e) const {
    return WorldError("lost the store at " + address() + " hosted by " + store_host() + " in " +
                      std::string(what) + " (" + one_line(e) + "): " + store_gone());
  }

  void wait_for_all(const std::string& what, const std::string& prefix, bool watch) {
    const Clock::time_point start = Clock::now();
    Clock::time_point next_check = start + kHeartbeatInterval;
    PeerWatch watched;
    milliseconds pause{1};
    while (store->add(prefix + "/count", 0) < size) {
      const Clock::time_point now = Clock::now();
      const bool timed_out = now - start >= timeout;
      if (now >= next_check || timed_out) {
        std::vector<int> missing;
        for (int r = 0; r < size; ++r) {
          if (!store->check({rank_key(prefix, r)})) missing.push_back(r);
        }
        if (watch) watched.check(*store, missing, what);
        if (timed_out) {
          throw WorldError(what + " timed out after " + seconds_text(timeout) + ": " +
                           std::to_string(size - static_cast<int>(missing.size())) + " of " +
                           std::to_string(size) + " ranks arrived (missing: " + rank_list(missing) +
                           ")");
        }
        next_check = now + kHeartbeatInterval;
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, milliseconds{100});
    }
  }

  // Every rank arrives with its config hash; rank 0 compares them all and posts one verdict,
  // so that every rank stops with the same message (none goes on to wait for the others).
  void rendezvous(const std::string& config_hash) {
    store->set(rank_key("config_hash", rank), store_bytes(config_hash));
    meet("rendezvous at " + address(), "arrived", "1", true, false);
    if (rank == 0) {
      std::string verdict;
      int differing = 0;
      for (int r = 1; r < size; ++r) {
        const std::string theirs = store_text(store->get(rank_key("config_hash", r)));
        if (theirs == config_hash) continue;
        if (differing++ == 0) {
          verdict = "rank " + std::to_string(r) + "'s config differs from rank 0's (hash " +
                    theirs + " vs " + config_hash + ")";
        }
      }
      if (differing > 1) verdict += " and so do " + std::to_string(differing - 1) + " other ranks'";
      if (differing > 0) verdict += ": start every rank with the same config and overrides";
      store->set("config_verdict", store_bytes(verdict.empty() ? "ok" : verdict));
    }
    const Clock::time_point start = Clock::now();
    while (!store->check({"config_verdict"})) {
      if (Clock::now() - start >= timeout) {
        throw WorldError("rank 0 did not compare the config hashes within " +
                         seconds_text(timeout) + " (store at " + address() + ")");
      }
      std::this_thread::sleep_for(milliseconds{10});
    }
    const std::string verdict = store_text(store->get("config_verdict"));
    // Rank 0 hosts the store: it must not leave before every rank has read the verdict.
    meet("config check", "verdict_read", "1", rank == 0, true);
    if (verdict != "ok") throw WorldError(verdict);
  }

  // A process group of `members` ranks in which this one is `member`, its backend's own
  // rendezvous keys under `prefix` in the store, apart from ours: Gloo, or `nccl`.
  c10::intrusive_ptr<Group> make_group(const std::string& prefix,
                                       int member,
                                       int members,
                                       bool nccl = false) {
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(prefix, store);
    try {
      if (!nccl) {
        auto options = c10d::ProcessGroupGloo::Options::create(timeout);
        options->devices.push_back(gloo_device(host));
        return c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, member, members, options);
      }
#ifdef FLOWTRAIN_WITH_CUDA
      auto options = c10d::ProcessGroupNCCL::Options::create();
      options->timeout = timeout;
      return c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, member, members, options);
#endif
    } catch (const std::exception& e) {
      throw WorldError("rank " + std::to_string(rank) + " cannot create the " +
                       (nccl ? "nccl" : "gloo") + " process group '" + prefix + "' (store at " +
                       address() + "): " + one_line(e));
    }
    throw Error("no NCCL process group: this flowtrain was built without CUDA");
  }
};

World::World(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
World::~World() = default;

World* World::init(const JobPlacement& placement, const WorldOptions& options) {
  if (!placement.distributed()) return nullptr;
  if (g_world) throw Error("this process already joined a job (World::init called twice)");
  // A peer's closed socket must surface as an error of the collective, not end this process.
  std::signal(SIGPIPE, SIG_IGN);
  auto impl = std::make_unique<Impl>();
  impl->rank = placement.rank;
  impl->size = placement.world_size;
  impl->host = placement.master_addr.empty() ? "127.0.0.1" : placement.master_addr;
  impl->port = placement.master_port > 0 ? placement.master_port : kDefaultPort;
  impl->agent_store = placement.agent_store;
  impl->restart = placement.restart;
  impl->timeout = options.timeout;
  impl->backend = resolve_backend(options.backend);
  impl->connect();
  impl->heartbeats.emplace(*impl->monitor, impl->monitor_mutex, impl->rank);
  impl->rendezvous(options.config_hash);
  impl->group = impl->make_group("pg", impl->rank, impl->size);
  g_world.reset(new World(std::move(impl)));
  return g_world.get();
}

World* World::current() { return g_world.get(); }

void World::shutdown() {
  if (!g_world) return;
  g_world->barrier("shutdown");
  // Rank 0 hosts the store: it leaves last, once no other rank uses the store any more.
  Impl& w = *g_world->impl_;
  w.meet("shutdown", "left", "1", w.rank == 0, true);
  g_world.reset();
}

int World::rank() const { return impl_->rank; }
int World::size() const { return impl_->size; }
const std::string& World::backend() const { return impl_->backend; }
std::string World::address() const { return impl_->address(); }
Group& World::group() { return *impl_->group; }

Group& World::group_for(const c10::Device& device) {
  Impl& s = *impl_;
  if (!device.is_cuda() || s.backend == "gloo") return *s.group;
  if (!s.gpu_group) {
#ifdef FLOWTRAIN_WITH_CUDA
    c10::cuda::set_device(device.index());  // NCCL's communicator binds to the current GPU
#endif
    s.gpu_group = s.make_group("pg/nccl", s.rank, s.size, /*nccl=*/true);
  }
  return *s.gpu_group;
}

Group& World::subgroup(const std::vector<int>& ranks) {
  Impl& s = *impl_;
  const auto found = s.subgroups.find(ranks);
  if (found != s.subgroups.end()) return *found->second;
  const auto me = std::find(ranks.begin(), ranks.end(), s.rank);
  if (me == ranks.end() || !std::is_sorted(ranks.begin(), ranks.end()) || ranks.front() < 0 ||
      ranks.back() >= s.size || std::adjacent_find(ranks.begin(), ranks.end()) != ranks.end()) {
    throw Error("World::subgroup: rank " + std::to_string(s.rank) + " asked for a group of " +
                rank_list(ranks) + " of " + std::to_string(s.size) +
                " (sorted, distinct, and including itself)");
  }
  std::string prefix = "pg/group";
  for (const int r : ranks) prefix += "/" + std::to_string(r);
  auto group =
      s.make_group(prefix, static_cast<int>(me - ranks.begin()), static_cast<int>(ranks.size()));
  return *s.subgroups.emplace(ranks, std::move(group)).first->second;
}

c10d::Store& World::store() { return *impl_->store; }
StopVote& World::stop_vote() { return impl_->stop_vote; }
std::chrono::milliseconds World::timeout() const { return impl_->timeout; }

void World::barrier(const std::string& what) {
  const std::string prefix = "barrier/" + std::to_string(impl_->sequence++);
  impl_->meet("barrier '" + what + "'", prefix, "1", true, true);
}

void World::wait(c10d::Work& work, std::string_view what) {
  // True once the work is done; false when a beat passed first.
  auto done = [&work] {
    try {
      work.wait(kHeartbeatInterval);  // throws when the interval passes first
      return true;
    } catch (const c10::Error&) {
      if (!work.isCompleted()) return false;
      work.wait();  // done after all (its own error, or it completed just now): it says which
      return true;
    }
  };
  if (done()) return;  // as almost always: nothing below is on the hot path
  Impl& w = *impl_;
  const std::string finished = "finished/" + std::to_string(w.phases_finished.load());
  std::vector<int> others;
  for (int r = 0; r < w.size; ++r) {
    if (r != w.rank) others.push_back(r);
  }
  PeerWatch watched;
  std::set<int> ahead;  // ranks seen to have finished this phase, a beat ago
  do {
    std::lock_guard<std::mutex> lock(w.monitor_mutex);
    try {
      watched.check(*w.monitor, others, what);
      for (const int r : others) {
        if (!w.monitor->check({rank_key(finished, r)})) continue;
        // A rank that finished took part in every collective of its phase, so one matched
        // with this one would have completed within the beat since it was first seen.
        if (!ahead.insert(r).second) {
          throw WorldError(
              "the ranks took different numbers of steps: rank " + std::to_string(r) +
              " finished " + store_text(w.monitor->get(rank_key(finished, r))) +
              ", while this rank waits in " + std::string(what) +
              " (items dropped on one rank only leave it steps short: keep on_bad_sample: replace, "
              "and drop nothing in your own stages under data parallelism)");
        }
      }
    } catch (const WorldError&) {
      throw;
    } catch (const std::exception& e) {
      throw w.store_lost(what, e);
    }
  } while (!done());
}

void World::finished_phase(const std::string& summary) {
  Impl& w = *impl_;
  std::lock_guard<std::mutex> lock(w.monitor_mutex);
  w.monitor->set(rank_key("finished/" + std::to_string(w.phases_finished++), w.rank),
                 store_bytes(summary));
}

std::vector<std::string> World::gather_text(const std::string& what, const std::string& text_in) {
  const std::string prefix = "gather/" + std::to_string(impl_->sequence++);
  impl_->meet("gather '" + what + "'", prefix, text_in, impl_->rank == 0, true);
  if (impl_->rank != 0) return {};
  std::vector<std::string> texts;
  for (int r = 0; r < impl_->size; ++r)
    texts.push_back(store_text(impl_->store->get(rank_key(prefix, r))));
  return texts;
}

std::string World::diagnose() const {
  const Impl& w = *impl_;
  // The monitor connection is shared with the heartbeat thread: hold it for one read at a time.
  auto failure = [&w](int r) -> std::optional<std::string> {
    std::lock_guard<std::mutex> lock(w.monitor_mutex);
    if (!w.monitor->check({rank_key("failed", r)})) return std::nullopt;
    return store_text(w.monitor->get(rank_key("failed", r)));
  };
  auto heartbeat = [&w](int r) {
    std::lock_guard<std::mutex> lock(w.monitor_mutex);
    return read_heartbeat(*w.monitor, r);
  };
  std::vector<std::string> found;
  try {
    std::map<int, Heartbeat> first;
    for (int r = 0; r < w.size; ++r) {
      if (r == w.rank) continue;
      if (const std::optional<std::string> message = failure(r)) {
        found.push_back("rank " + std::to_string(r) + " failed: " + *message);
      } else {
        first[r] = heartbeat(r);
      }
    }
    // Two beats and a half: a live rank's counter moves, a dead one's does not.
    if (!first.empty()) std::this_thread::sleep_for(kHeartbeatInterval * 5 / 2);
    for (const auto& [r, before] : first) {
      const Heartbeat now = heartbeat(r);
      if (now.count == before.count) found.push_back(stale_text(r, now));
    }
  } catch (const std::exception& e) {
    return "cannot reach the store at " + w.address() + " hosted by " + w.store_host() + " (" +
           one_line(e) + "): " + w.store_gone();
  }
  if (found.empty()) {
    return "every other rank is alive (heartbeats current): one may be stuck or much slower";
  }
  std::string line;
  for (const std::string& f : found) line += (line.empty() ? "" : "; ") + f;
  return line;
}

void World::report_failure(const std::string& message) noexcept {
  try {
    std::lock_guard<std::mutex> lock(impl_->monitor_mutex);
    impl_->monitor->set(rank_key("failed", impl_->rank), store_bytes(message));
  } catch (...) {
    // Nobody to tell: the store is gone.
  }
}

std::string config_file_fingerprint(const std::string& path,
                                    const std::vector<std::string>& overrides) {
  std::vector<std::uint8_t> buffer;
  std::span<const std::uint8_t> bytes;
  read_file(path, buffer, bytes);  // unreadable: the run fails on it before the ranks meet
  std::string text(bytes.begin(), bytes.end());
  for (const std::string& o : overrides) text += "\n" + o;
  return config_fingerprint(text);
}

std::string config_fingerprint(std::string_view text_in) {
  std::uint64_t hash = 0xcbf29ce484222325ULL;  // FNV-1a, 64 bits
  for (const char c : text_in) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 0x100000001b3ULL;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(hash));
  return buf;
}

}  // namespace flowtrain::dist
