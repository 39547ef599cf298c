// World across processes: the test binary starts two copies of itself as ranks 0 and 1 over
// loopback (child modes below), each on its own free port so the tests can run in parallel.
#include <ATen/ATen.h>
#include <doctest/doctest.h>
#include <torch/cuda.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <thread>

#include "distributed/job.hpp"
#include "distributed/launch.hpp"
#include "distributed/exit.hpp"
#include "distributed/world.hpp"
#include "tests/dist/child_ranks.hpp"
#include "tests/process.hpp"

namespace flowtrain::testing {

namespace {

std::string env_or(const char* name, const char* fallback) {
  const char* value = std::getenv(name);
  return value ? value : fallback;
}

dist::WorldOptions child_options() {
  dist::WorldOptions options;
  options.backend = "gloo";
  options.timeout = std::chrono::milliseconds(std::stoi(env_or("TEST_TIMEOUT_MS", "30000")));
  options.config_hash = env_or("TEST_CONFIG_HASH", "same");
  return options;
}

// Sum, broadcast, gather, barrier, shutdown; prints what it got.
int child_collectives() {
  dist::World* world = dist::World::init(job_placement_from_env(), child_options());
  const int rank = world->rank();
  std::vector<at::Tensor> sum = {at::tensor({rank + 1.0f, 2.0f})};
  world->group().allreduce(sum)->wait();
  std::vector<at::Tensor> from_root = {at::full({3}, rank == 0 ? 42.0f : -1.0f)};
  world->group().broadcast(from_root)->wait();
  const std::vector<std::string> texts =
      world->gather_text("greetings", "hi from " + std::to_string(rank));
  world->barrier("after greetings");
  std::printf("rank %d of %d (%s): sum %g %g broadcast %g %g %g gathered %zu%s\n", rank,
              world->size(), world->backend().c_str(), sum[0][0].item<float>(),
              sum[0][1].item<float>(), from_root[0][0].item<float>(), from_root[0][1].item<float>(),
              from_root[0][2].item<float>(), texts.size(),
              texts.empty() ? "" : (" [" + texts[0] + ", " + texts[1] + "]").c_str());
  std::fflush(stdout);
  dist::World::shutdown();
  std::printf("rank %d left, world %s\n", rank, dist::World::current() ? "kept" : "gone");
  return 0;
}

int child_init_only() {
  try {
    dist::World::init(job_placement_from_env(), child_options());
    dist::World::shutdown();
    std::printf("joined\n");
    return 0;
  } catch (const std::exception& e) {
    std::printf("error: %s\n", e.what());
    return 3;
  }
}

// Allreduces in a loop; the rank named by TEST_KILL_RANK kills itself after 20 steps. The
// survivor prints the error the way the CLI does (with diagnose()) and exits 1.
int child_killed() {
  dist::World* world = dist::World::init(job_placement_from_env(), child_options());
  const int kill_rank = std::stoi(env_or("TEST_KILL_RANK", "1"));
  for (int step = 0; step < 100000; ++step) {
    if (world->rank() == kill_rank && step == 20) raise(SIGKILL);
    try {
      std::vector<at::Tensor> t = {at::ones({4})};
      world->group().allreduce(t)->wait();
    } catch (const std::exception& e) {
      std::string what = e.what();
      what = what.substr(0, what.find('\n'));
      std::printf("error: rank %d: %s; %s\n", world->rank(), what.c_str(),
                  world->diagnose().c_str());
      std::fflush(stdout);
      std::_Exit(1);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return 0;
}

// Allreduces through World::wait: the rank named by TEST_SHORT_RANK takes 5 steps (as if it had
// dropped a batch), the others TEST_STEPS (default 100000, 5 ms apart); then each says it
// finished the phase and meets the others. Errors end it as they end the CLI.
int child_watched() {
  dist::World* world = dist::World::init(job_placement_from_env(), child_options());
  const int rank = world->rank();
  // Says it joined (TEST_JOINED_FILE): a test may wait for that before it stops this rank.
  if (const std::string mark = env_or("TEST_JOINED_FILE", ""); !mark.empty()) {
    std::ofstream(mark + std::to_string(rank)) << "joined\n";
  }
  const int short_rank = std::stoi(env_or("TEST_SHORT_RANK", "-1"));
  const int steps = rank == short_rank ? 5 : std::stoi(env_or("TEST_STEPS", "100000"));
  try {
    for (int step = 0; step < steps; ++step) {
      std::vector<at::Tensor> t = {at::ones({4})};
      world->wait(*world->group().allreduce(t), "the all-reduce of step " + std::to_string(step));
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    world->finished_phase("phase main (" + std::to_string(steps) + " steps)");
    world->gather_text("summaries of phase main", "");
    dist::World::shutdown();
  } catch (const std::exception& e) {
    return dist::exit_on_error(e, "child");
  }
  std::printf("rank %d done\n", rank);
  return 0;
}

std::string self_path() { return std::filesystem::read_symlink("/proc/self/exe").string(); }

std::string log_path(const std::string& test, int rank) {
  return (std::filesystem::temp_directory_path() /
          ("flowtrain-dist-" + test + "-" + std::to_string(getpid()) + "-" + std::to_string(rank) +
           ".log"))
      .string();
}

}  // namespace

std::vector<Process> start_ranks(const std::string& test,
                                 const std::string& mode,
                                 int size,
                                 const std::function<std::vector<std::string>(int)>& extra) {
  const int port = dist::free_local_port();
  std::vector<Process> ranks;
  for (int r = 0; r < size; ++r) {
    std::vector<std::string> env = {"FLOWTRAIN_DIST_TEST_CHILD=" + mode,
                                    "RANK=" + std::to_string(r),
                                    "WORLD_SIZE=" + std::to_string(size),
                                    "LOCAL_RANK=" + std::to_string(r),
                                    "MASTER_ADDR=127.0.0.1",
                                    "MASTER_PORT=" + std::to_string(port)};
    for (const std::string& e : extra(r)) env.push_back(e);
    ranks.push_back(spawn({self_path()}, env, log_path(test, r)));
  }
  return ranks;
}

int run_child(const std::string& mode) {
  const std::map<std::string, std::function<int()>> modes = {
      {"collectives", child_collectives}, {"init_only", child_init_only}, {"killed", child_killed},
      {"watched", child_watched},         {"grad_sync", child_grad_sync},
  };
  const auto it = modes.find(mode);
  if (it == modes.end()) {
    std::fprintf(stderr, "unknown child mode '%s'\n", mode.c_str());
    return 2;
  }
  try {
    return it->second();
  } catch (const std::exception& e) {
    std::printf("error: %s\n", e.what());
    return 4;
  }
}

TEST_CASE("Dist.World.AllreduceBroadcastGatherAcrossTwoProcesses" * doctest::timeout(90)) {
  std::vector<Process> ranks =
      start_ranks("collectives", "collectives", 2, [](int) { return std::vector<std::string>{}; });
  const Exit r0 = wait_for(ranks[0], 60);
  const Exit r1 = wait_for(ranks[1], 60);
  INFO("rank 0:\n" << r0.output << "rank 1:\n" << r1.output);
  CHECK(r0.code == 0);
  CHECK(r1.code == 0);
  CHECK(r0.output.find("rank 0 of 2 (gloo): sum 3 4 broadcast 42 42 42 gathered 2 "
                       "[hi from 0, hi from 1]") != std::string::npos);
  CHECK(r1.output.find("rank 1 of 2 (gloo): sum 3 4 broadcast 42 42 42 gathered 0") !=
        std::string::npos);
  CHECK(r0.output.find("rank 0 left, world gone") != std::string::npos);
  CHECK(r1.output.find("rank 1 left, world gone") != std::string::npos);
}

TEST_CASE("Dist.World.ConfigHashMismatchNamesBothRanks" * doctest::timeout(90)) {
  std::vector<Process> ranks = start_ranks("hash", "init_only", 2, [](int r) {
    return std::vector<std::string>{r == 0 ? "TEST_CONFIG_HASH=aaaa" : "TEST_CONFIG_HASH=bbbb"};
  });
  const Exit r0 = wait_for(ranks[0], 60);
  const Exit r1 = wait_for(ranks[1], 60);
  INFO("rank 0:\n" << r0.output << "rank 1:\n" << r1.output);
  const std::string expected =
      "error: rank 1's config differs from rank 0's (hash bbbb vs aaaa): start every rank with "
      "the same config and overrides\n";
  CHECK(r0.code == 3);
  CHECK(r1.code == 3);
  CHECK(r0.output == expected);
  CHECK(r1.output == expected);
}

TEST_CASE("Dist.World.KilledRankNamedBySurvivor" * doctest::timeout(90)) {
  std::vector<Process> ranks = start_ranks("killed-1", "killed", 2, [](int) {
    return std::vector<std::string>{"TEST_TIMEOUT_MS=10000", "TEST_KILL_RANK=1"};
  });
  const Exit r1 = wait_for(ranks[1], 60);
  const Exit r0 = wait_for(ranks[0], 60);
  INFO("rank 0:\n" << r0.output << "rank 1:\n" << r1.output);
  CHECK(r1.signal == SIGKILL);
  CHECK(r0.code == 1);
  CHECK(r0.output.find("error: rank 0: ") == 0);
  CHECK(r0.output.find("; rank 1 stopped responding") != std::string::npos);
  CHECK(r0.output.find("s ago (killed or hung?)\n") != std::string::npos);
  // The survivor notices the dead peer on its next collective, well within the 10 s timeout.
  CHECK(r0.seconds - r1.seconds < 10);
}

// A rank a step short used to leave the others in the all-reduce until the collective timeout,
// with Gloo's "Timed out waiting ... for recv"; World::wait names it within seconds.
TEST_CASE("Dist.World.RankStepsShortNamedByTheOthers" * doctest::timeout(90)) {
  std::vector<Process> ranks = start_ranks("short", "watched", 2, [](int) {
    return std::vector<std::string>{"TEST_TIMEOUT_MS=60000", "TEST_SHORT_RANK=1", "TEST_STEPS=6"};
  });
  const Exit r0 = wait_for(ranks[0], 80);
  const Exit r1 = wait_for(ranks[1], 80);
  INFO("rank 0:\n" << r0.output << "rank 1:\n" << r1.output);
  CHECK(r0.code == 1);
  CHECK(r1.code == 1);
  CHECK(r0.output ==
        "child: error: rank 0: the ranks took different numbers of steps: rank 1 finished phase "
        "main (5 steps), while this rank waits in the all-reduce of step 5 (items dropped on one "
        "rank only leave it steps short: keep on_bad_sample: replace, and drop nothing in your own "
        "stages under data parallelism)\n");
  // Rank 0, which hosts the store, stays long enough for rank 1 to read why it failed.
  CHECK(r1.output.find("child: error: rank 1: rank 0 failed: the ranks took different numbers "
                       "of steps") == 0);
  CHECK(r0.seconds < 15);  // two beats or so, not the 60 s timeout
  CHECK(r1.seconds < 15);
}

// A rank that stops (SIGSTOP: a debugger, a swapped-out machine) keeps its sockets open, so
// Gloo would wait the whole timeout; World::wait sees its heartbeat stop.
TEST_CASE("Dist.World.StoppedRankNamedWithinSeconds" * doctest::timeout(90)) {
  const std::string mark = log_path("stopped-joined", 0);
  const auto started = std::chrono::steady_clock::now();
  std::vector<Process> ranks = start_ranks("stopped", "watched", 2, [&mark](int) {
    return std::vector<std::string>{"TEST_TIMEOUT_MS=60000", "TEST_JOINED_FILE=" + mark};
  });
  // Stopped once both ranks have joined and are stepping (a fixed wait raced a slow start on a
  // loaded machine: the rank was stopped before the rendezvous, which then timed out instead).
  const auto joined = [&mark](int rank) {
    return std::filesystem::exists(mark + std::to_string(rank));
  };
  for (int i = 0; i < 600 && !(joined(0) && joined(1)); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  REQUIRE(joined(1));
  std::this_thread::sleep_for(std::chrono::seconds(1));  // a few steps into the all-reduces
  ::kill(ranks[1].pid, SIGSTOP);
  // Seconds from the ranks' start to the stop (rank 0's exit counts from its start).
  const double stopped_at =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const Exit r0 = wait_for(ranks[0], 80);
  ::kill(ranks[1].pid, SIGKILL);
  const Exit r1 = wait_for(ranks[1], 10);
  INFO("rank 0:\n" << r0.output);
  CHECK(r0.code == 1);
  CHECK(r0.output.find("child: error: rank 0: rank 1 stopped responding") == 0);
  CHECK(r0.output.find("in the all-reduce of step ") != std::string::npos);
  CHECK(r0.seconds - stopped_at < 20);  // named within seconds of the stop
  for (int rank : {0, 1}) std::filesystem::remove(mark + std::to_string(rank));
}

TEST_CASE("Dist.World.KilledStoreHostNamedBySurvivor" * doctest::timeout(90)) {
  std::vector<Process> ranks = start_ranks("killed-0", "killed", 2, [](int) {
    return std::vector<std::string>{"TEST_TIMEOUT_MS=10000", "TEST_KILL_RANK=0"};
  });
  const Exit r0 = wait_for(ranks[0], 60);
  const Exit r1 = wait_for(ranks[1], 60);
  INFO("rank 0:\n" << r0.output << "rank 1:\n" << r1.output);
  CHECK(r0.signal == SIGKILL);
  CHECK(r1.code == 1);
  CHECK(r1.output.find("error: rank 1: ") == 0);
  CHECK(r1.output.find("; cannot reach the store at 127.0.0.1:") != std::string::npos);
  CHECK(r1.output.find("hosted by rank 0") != std::string::npos);
  CHECK(r1.seconds - r0.seconds < 10);
}

TEST_CASE("Dist.World.RendezvousTimeoutNamesAddressAndMissingRank" * doctest::timeout(60)) {
  JobPlacement alone;
  alone.world_size = 2;
  alone.rank = 0;
  alone.master_addr = "127.0.0.1";
  alone.master_port = dist::free_local_port();
  dist::WorldOptions options;
  options.backend = "gloo";
  options.timeout = std::chrono::milliseconds(1500);
  CHECK_THROWS_WITH_AS(dist::World::init(alone, options),
                       ("rendezvous at 127.0.0.1:" + std::to_string(alone.master_port) +
                        " timed out after 1.5 s: 1 of 2 ranks arrived (missing: rank 1)")
                           .c_str(),
                       dist::WorldError);
  CHECK(dist::World::current() == nullptr);
}

TEST_CASE("Dist.World.UnreachableStoreNamesAddress" * doctest::timeout(60)) {
  JobPlacement late;
  late.world_size = 2;
  late.rank = 1;
  late.master_addr = "127.0.0.1";
  late.master_port = dist::free_local_port();
  dist::WorldOptions options;
  options.backend = "gloo";
  options.timeout = std::chrono::milliseconds(1500);
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(dist::World::init(late, options),
                       doctest::Contains(("rank 1 cannot reach the rendezvous store at 127.0.0.1:" +
                                          std::to_string(late.master_port) + " within 1.5 s (")
                                             .c_str()),
                       dist::WorldError);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(20));
}

TEST_CASE("Dist.World.SingleProcessHasNoWorld") {
  CHECK(dist::World::init(JobPlacement{}, dist::WorldOptions{}) == nullptr);
  CHECK(dist::World::current() == nullptr);
  dist::World::shutdown();  // a no-op
}

TEST_CASE("Dist.World.NcclWithoutCudaIsOneLine") {
  if (torch::cuda::is_available()) return;  // NCCL would work here
  JobPlacement two;
  two.world_size = 2;
  dist::WorldOptions options;
  options.backend = "nccl";
  CHECK_THROWS_WITH_AS(dist::World::init(two, options), doctest::Contains("backend 'nccl' needs a"),
                       Error);
  options.backend = "mpi";
  CHECK_THROWS_WITH_AS(dist::World::init(two, options),
                       "unknown backend 'mpi': use auto, gloo or nccl", Error);
}

TEST_CASE("Dist.World.ConfigFingerprintIsFnv1a") {
  CHECK(dist::config_fingerprint("") == "cbf29ce484222325");
  CHECK(dist::config_fingerprint("a") == "af63dc4c8601ec8c");
  CHECK(dist::config_fingerprint("threads: 1") != dist::config_fingerprint("threads: 2"));
}

}  // namespace flowtrain::testing
