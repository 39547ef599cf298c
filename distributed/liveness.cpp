#include "distributed/liveness.hpp"

#include <algorithm>
#include <cstdio>

#include "distributed/world.hpp"

namespace flowtrain::dist {

namespace {
std::int64_t unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}
}  // namespace

std::string rank_key(const std::string& prefix, int rank) {
  return prefix + "/" + std::to_string(rank);
}

std::vector<std::uint8_t> store_bytes(const std::string& text) {
  return {text.begin(), text.end()};
}
std::string store_text(const std::vector<std::uint8_t>& bytes) {
  return {bytes.begin(), bytes.end()};
}

Heartbeat read_heartbeat(c10d::Store& from, int rank) {
  Heartbeat h;
  const std::string k = rank_key("heartbeat", rank);
  if (!from.check({k})) return h;
  std::sscanf(store_text(from.get(k)).c_str(), "%lld %lld", reinterpret_cast<long long*>(&h.count),
              reinterpret_cast<long long*>(&h.unix_ms));
  return h;
}

std::string stale_text(int rank, const Heartbeat& last) {
  const std::int64_t ago_s = std::max<std::int64_t>(0, (unix_ms() - last.unix_ms + 500) / 1000);
  return "rank " + std::to_string(rank) + " stopped responding " + std::to_string(ago_s) +
         " s ago (killed or hung?)";
}

HeartbeatThread::HeartbeatThread(c10d::Store& monitor, std::mutex& monitor_mutex, int rank)
    : monitor_(monitor), monitor_mutex_(monitor_mutex), rank_(rank) {
  beat();  // the first one before anyone can wait on it
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!wake_.wait_for(lock, kHeartbeatInterval, [this] { return stop_; })) {
      lock.unlock();
      beat();
      lock.lock();
    }
  });
}

HeartbeatThread::~HeartbeatThread() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void HeartbeatThread::beat() {
  ++beats_;
  try {
    std::lock_guard<std::mutex> lock(monitor_mutex_);
    monitor_.set(rank_key("heartbeat", rank_),
                 store_bytes(std::to_string(beats_) + " " + std::to_string(unix_ms())));
  } catch (const std::exception&) {
    // The store is gone (its host exited): the failing collective and diagnose() will say so.
  }
}

void PeerWatch::check(c10d::Store& from, const std::vector<int>& ranks, std::string_view what) {
  const Clock::time_point now = Clock::now();
  for (const int r : ranks) {
    if (from.check({rank_key("failed", r)})) {
      throw WorldError("rank " + std::to_string(r) +
                       " failed: " + store_text(from.get(rank_key("failed", r))));
    }
    const Heartbeat h = read_heartbeat(from, r);
    if (h.count < 0) continue;  // not started yet (only during the rendezvous)
    auto it = seen_.find(r);
    if (it == seen_.end() || it->second.first.count != h.count) {
      seen_[r] = {h, now};
    } else if (now - it->second.second >= kStaleAfter) {
      throw WorldError(stale_text(r, h) + " in " + std::string(what));
    }
  }
}

}  // namespace flowtrain::dist
