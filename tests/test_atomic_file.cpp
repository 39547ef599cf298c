#include <doctest/doctest.h>

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
