#include <doctest/doctest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "graph/atomic_file.hpp"
#include "graph/error.hpp"
#include "tests/temp_dir.hpp"

using namespace flowtrain;
using flowtrain::testing::TempDir;
namespace fs = std::filesystem;

namespace {

std::string read(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

}  // namespace

TEST_CASE("Files.AtomicFile.CommitReplacesTheFileWhole") {
  TempDir dir("atomic");
  const std::string path = dir.str("a.bin");
  write_file_atomically(path, "old");
  {
    AtomicFile file(path);
    file.write("new ");
    file.write("content");
    CHECK(file.size() == 11);
    CHECK(read(path) == "old");  // not visible before commit
    CHECK(fs::exists(path + ".tmp"));
    file.commit();
  }
  CHECK(read(path) == "new content");
  CHECK_FALSE(fs::exists(path + ".tmp"));
  AtomicFile twice(dir.str("b.bin"));
  twice.commit();
  CHECK_THROWS_WITH_AS(twice.write("x"), doctest::Contains("written after commit"), Error);
}

TEST_CASE("Files.AtomicFile.AbandonedWriteKeepsTheOldFileAndNoTemporary") {
  TempDir dir("atomic");
  const std::string path = dir.str("a.bin");
  write_file_atomically(path, "old");
  {
    AtomicFile file(path);
    file.write(std::string(1 << 20, 'x'));
  }  // an exception elsewhere: no commit
  CHECK(read(path) == "old");
  CHECK_FALSE(fs::exists(path + ".tmp"));
}

TEST_CASE("Files.AtomicFile.FullDiskNamesTheFileAndLeavesNothing") {
  // /dev/full fails every write with ENOSPC (a full disk where no tmpfs can be mounted): the
  // temporary is a link to it.
  if (!fs::exists("/dev/full")) {
    MESSAGE("no /dev/full on this machine: not checked");
    return;
  }
  TempDir dir("atomic");
  const std::string path = dir.str("final.pt");
  fs::create_symlink("/dev/full", path + ".tmp");
  const std::string expected =
      "cannot write " + path + ": writing " + path + ".tmp failed (No space left on device)";
  CHECK_THROWS_WITH_AS(write_file_atomically(path, std::string(1 << 16, 'x')), expected.c_str(),
                       Error);
  CHECK_FALSE(fs::exists(path));
  CHECK_FALSE(fs::is_symlink(path + ".tmp"));
}

TEST_CASE("Files.AtomicFile.MissingFolderNamesThePath") {
  TempDir dir("atomic");
  const std::string path = dir.str("no/such/a.bin");
  CHECK_THROWS_WITH_AS(
      write_file_atomically(path, "x"),
      ("cannot write " + path + ": cannot create " + path + ".tmp (No such file or directory)")
          .c_str(),
      Error);
}

TEST_CASE("Files.AtomicFile.RefusesATargetThatIsNoRegularFile") {
  // The rename replaced a FIFO (as root, /dev/full) with a regular file and said "wrote".
  TempDir dir("atomic");
  const std::string fifo = dir.str("run.trace.json");
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  CHECK_THROWS_WITH_AS(
      write_file_atomically(fifo, "x"),
      ("cannot write " + fifo +
       ": it is a FIFO, not a regular file (moving a new file there would replace it)")
          .c_str(),
      Error);
  CHECK(fs::is_fifo(fifo));
  CHECK_FALSE(fs::exists(fifo + ".tmp"));

  const std::string folder = dir.str("final.pt");
  fs::create_directory(folder);
  CHECK_THROWS_WITH_AS(check_can_write_atomically(folder),
                       doctest::Contains("it is a folder, not a regular file"), Error);
  CHECK(fs::is_directory(folder));

  // One that appears between the file's creation and its commit.
  const std::string late = dir.str("late.bin");
  {
    AtomicFile file(late);
    file.write("x");
    REQUIRE(::mkfifo(late.c_str(), 0644) == 0);
    CHECK_THROWS_WITH_AS(file.commit(), doctest::Contains("it is a FIFO"), Error);
  }
  CHECK(fs::is_fifo(late));
  CHECK_FALSE(fs::exists(late + ".tmp"));

  if (fs::exists("/dev/null")) {
    CHECK_THROWS_WITH_AS(write_file_atomically("/dev/null", "x"),
                         doctest::Contains("/dev/null: it is a character device"), Error);
  }
  // A regular file, and a path that does not exist yet, are fine.
  write_file_atomically(dir.str("a.bin"), "old");
  check_can_write_atomically(dir.str("a.bin"));
  check_can_write_atomically(dir.str("b.bin"));
  CHECK_FALSE(fs::exists(dir.str("b.bin")));
  CHECK_FALSE(fs::exists(dir.str("b.bin.tmp")));
}

TEST_CASE("Files.AtomicFile.CheckCanWriteNamesTheProblemAndLeavesNothing") {
  TempDir dir("atomic");
  const std::string path = dir.str("no/such/run.trace.json");
  CHECK_THROWS_WITH_AS(
      check_can_write_atomically(path),
      ("cannot write " + path + ": cannot create " + path + ".tmp (No such file or directory)")
          .c_str(),
      Error);
}
