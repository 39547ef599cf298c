#pragma once

#include <stdlib.h>

#include <filesystem>
#include <stdexcept>
#include <string>

namespace flowtrain::testing {

/// A fresh folder under the system temp folder, removed with everything in it at scope exit.
///
///   TempDir dir("prepare");
///   std::ofstream(dir / "a.txt") << "x";   // dir.path() / "a.txt"
///   run(dir.str("b.csv"));                 // the same as a string
class TempDir {
 public:
  explicit TempDir(const std::string& tag = "test") {
    std::string pattern =
        (std::filesystem::temp_directory_path() / ("flowtrain-" + tag + "-XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }
  /// The folder, or a path inside it, as a string.
  std::string str() const { return path_.string(); }
  std::string str(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace flowtrain::testing
