#include <doctest/doctest.h>
#include <signal.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "graph/child_process.hpp"
#include "tests/temp_dir.hpp"

using namespace flowtrain;
using flowtrain::testing::TempDir;

namespace {

std::string read(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

}  // namespace

TEST_CASE("Files.ChildProcess.EnvironmentFolderAndOutputs" * doctest::timeout(30)) {
  TempDir dir("child");
  const Child child = start_child(
      {"sh", "-c", "echo \"$FLOWTRAIN_TEST_VALUE $(pwd)\"; echo oops >&2; read x; exit 3"},
      {.env = {"FLOWTRAIN_TEST_VALUE=seven"},
       .cwd = dir.str(),
       .output = dir.str("out.txt"),
       .errors = dir.str("err.txt"),
       .null_input = true,
       .search_path = true});
  const ChildExit e = wait_child(child, 20);
  CHECK(e.code == 3);
  CHECK(e.status() == 3);
  CHECK_FALSE(e.timed_out);
  CHECK(read(dir / "out.txt") == "seven " + std::filesystem::canonical(dir.path()).string() + "\n");
  CHECK(read(dir / "err.txt") == "oops\n");
}

TEST_CASE("Files.ChildProcess.TimeoutKillsAndSignalsAreReported" * doctest::timeout(30)) {
  const Child sleeper = start_child({"/bin/sleep", "30"});
  CHECK_FALSE(poll_child(sleeper).has_value());
  const ChildExit e = wait_child(sleeper, 0.2);
  CHECK(e.timed_out);
  CHECK(e.signal == SIGKILL);
  CHECK(e.status() == 128 + SIGKILL);
  CHECK(e.seconds < 10);
}

TEST_CASE("Files.ChildProcess.MissingProgramIsASpawnError") {
  try {
    start_child({"flowtrain-no-such-program"}, {.search_path = true});
    FAIL("started a program that does not exist");
  } catch (const SpawnError& e) {
    CHECK(e.error == ENOENT);
    CHECK(std::string(e.what()) ==
          "cannot start flowtrain-no-such-program: No such file or directory");
  }
}
