// The local launcher (launch_local) with shell ranks, and `flowtrain run` as ranks of a job:
// under --nproc, and started by hand as a user's launcher would.
#include <dirent.h>
#include <doctest/doctest.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <sstream>
#include <thread>

#include "distributed/launch.hpp"
#include "tests/process.hpp"

namespace flowtrain::testing {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

dist::LaunchOptions shell_ranks(int nproc, const std::string& script) {
  dist::LaunchOptions options;
  options.nproc = nproc;
  options.program = "/bin/sh";
  options.args = {"sh", "-c", script};
  return options;
}

std::string log_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("flowtrain-dist-" + name + "-" + std::to_string(getpid()) + ".log"))
      .string();
}

// Waits until `path` contains `text` (a rank got that far), at most `timeout_s`.
bool wait_for_text(const std::string& path, const std::string& text, double timeout_s) {
  const Clock::time_point start = Clock::now();
  while (seconds_since(start) < timeout_s) {
    if (read_text(path).find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// The child of `parent` whose environment says RANK=<rank>, or 0.
pid_t find_rank(pid_t parent, int rank) {
  DIR* proc = opendir("/proc");
  pid_t found = 0;
  while (dirent* entry = readdir(proc)) {
    const pid_t pid = static_cast<pid_t>(std::atoi(entry->d_name));
    if (pid <= 0) continue;
    const std::string stat = read_text("/proc/" + std::to_string(pid) + "/stat");
    const std::size_t paren = stat.rfind(')');
    if (paren == std::string::npos) continue;
    std::istringstream fields(stat.substr(paren + 2));
    std::string state;
    pid_t ppid = 0;
    fields >> state >> ppid;
    if (ppid != parent) continue;
    const std::string env = read_text("/proc/" + std::to_string(pid) + "/environ");
    if (env.find(std::string("RANK=") + std::to_string(rank) + '\0') == 0 ||
        env.find(std::string("\0RANK=", 6) + std::to_string(rank) + '\0') != std::string::npos) {
      found = pid;
    }
  }
  closedir(proc);
  return found;
}

const std::string kConfig = std::string(FLOWTRAIN_TEST_CONFIGS) + "/dist_spin.yaml";

}  // namespace

TEST_CASE("Dist.Launch.EveryRankGetsItsPlace" * doctest::timeout(60)) {
  std::ostringstream err;
  const int code = dist::launch_local(
      shell_ranks(3,
                  "test \"$WORLD_SIZE\" = 3 && test \"$LOCAL_RANK\" = \"$RANK\" && "
                  "test \"$MASTER_ADDR\" = 127.0.0.1 && test \"$MASTER_PORT\" -gt 0"),
      err);
  CHECK(code == 0);
  CHECK(err.str() == "");
}

TEST_CASE("Dist.Launch.FailingRankStopsTheOthers" * doctest::timeout(60)) {
  std::ostringstream err;
  const Clock::time_point start = Clock::now();
  const int code = dist::launch_local(
      shell_ranks(3, "if [ \"$RANK\" = 1 ]; then sleep 0.2; exit 3; fi; exec sleep 30"), err);
  CHECK(code == 3);
  CHECK(err.str() == "flowtrain: rank 1 exited with code 3; stopping the other ranks\n");
  CHECK(seconds_since(start) < 10);
}

TEST_CASE("Dist.Launch.RankIgnoringSigtermIsKilledAfterGrace" * doctest::timeout(60)) {
  std::ostringstream err;
  dist::LaunchOptions options = shell_ranks(
      2, "if [ \"$RANK\" = 1 ]; then sleep 0.2; kill -9 $$; fi; trap '' TERM; exec sleep 30");
  options.grace = std::chrono::milliseconds(500);
  const Clock::time_point start = Clock::now();
  const int code = dist::launch_local(options, err);
  CHECK(code == 128 + SIGKILL);
  CHECK(err.str() ==
        "flowtrain: rank 1 was killed by signal 9 (Killed); stopping the other ranks\n");
  CHECK(seconds_since(start) < 10);
}

TEST_CASE("Dist.Cli.LauncherNamesKilledRankAndStopsTheOther" * doctest::timeout(120)) {
  const std::string log = log_path("cli-launcher");
  const Process launcher =
      spawn({FLOWTRAIN_CLI, "run", kConfig, "stages.numbers.params.count=100000000", "--nproc", "2",
             "--timeout", "30"},
            {}, log);
  REQUIRE(wait_for_text(log, "on each of 2 ranks", 60));
  const pid_t rank1 = find_rank(launcher.pid, 1);
  REQUIRE(rank1 > 0);
  kill(rank1, SIGKILL);
  const Clock::time_point killed = Clock::now();
  const Exit e = wait_for(launcher, 90);
  INFO(e.output);
  CHECK(e.code == 128 + SIGKILL);
  CHECK(e.output.find("flowtrain: rank 1 was killed by signal 9 (Killed); stopping the other "
                      "ranks\n") != std::string::npos);
  CHECK(seconds_since(killed) < 20);
  CHECK(find_rank(launcher.pid, 0) == 0);  // no rank left behind
}

TEST_CASE("Dist.Cli.SurvivorNamesKilledRank" * doctest::timeout(120)) {
  // Two ranks started by hand, as torchrun or a job script would; rank 1 dies mid-phase.
  const int port = dist::free_local_port();
  std::vector<Process> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(spawn(
        {FLOWTRAIN_CLI, "run", kConfig, "stages.numbers.params.count=30000", "--timeout", "60"},
        {"RANK=" + std::to_string(r), "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1",
         "MASTER_PORT=" + std::to_string(port)},
        log_path("cli-survivor-" + std::to_string(r))));
  }
  REQUIRE(wait_for_text(ranks[0].log, "on each of 2 ranks", 60));
  kill(ranks[1].pid, SIGKILL);
  const Clock::time_point killed = Clock::now();
  const Exit r1 = wait_for(ranks[1], 30);
  const Exit r0 = wait_for(ranks[0], 90);
  INFO(r0.output);
  CHECK(r1.signal == SIGKILL);
  CHECK(r0.code == 1);
  CHECK(r0.output.find("flowtrain: error: rank 0: rank 1 stopped responding ") !=
        std::string::npos);
  CHECK(r0.output.find(" s ago (killed or hung?) in gather 'summaries of run'\n") !=
        std::string::npos);
  // From the heartbeats, well before the 60 s timeout.
  CHECK(seconds_since(killed) < 30);
}

TEST_CASE("Dist.Cli.DifferentOverridesRefusedByEveryRank" * doctest::timeout(120)) {
  const int port = dist::free_local_port();
  std::vector<Process> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(
        spawn({FLOWTRAIN_CLI, "run", kConfig,
               "stages.numbers.params.count=" + std::to_string(100 + r), "--timeout", "60"},
              {"RANK=" + std::to_string(r), "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1",
               "MASTER_PORT=" + std::to_string(port)},
              log_path("cli-hash-" + std::to_string(r))));
  }
  for (int r = 0; r < 2; ++r) {
    const Exit e = wait_for(ranks[r], 90);
    INFO(e.output);
    CHECK(e.code == 1);
    CHECK(e.output.rfind("flowtrain: error: rank " + std::to_string(r) +
                             ": rank 1's config differs from rank 0's (hash ",
                         0) == 0);
    CHECK(e.output.find("): start every rank with the same config and overrides\n") !=
          std::string::npos);
  }
}

}  // namespace flowtrain::testing
