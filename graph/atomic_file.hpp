#pragma once

// The one way flowtrain writes a file that must never be seen half-written (checkpoints,
// exported models, reports, shards, generated data): beside its destination, then moved over it.

#include <cstdint>
#include <string>
#include <string_view>

namespace flowtrain {

/// A file written to `path`.tmp and moved over `path` by commit(): fsync, rename, fsync of the
/// folder, so a crash leaves either the old file or the new one, never a torn one. Destroyed
/// before commit() (an error, an exception elsewhere), it removes the temporary. Every failure
/// throws Error("cannot write PATH: what failed (errno text)").
///   AtomicFile out("runs/a.ftpk");
///   out.write(header.data(), header.size());
///   out.commit();
class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, std::size_t size);
  void write(std::string_view bytes) { write(bytes.data(), bytes.size()); }
  /// Moves the file into place. Nothing may be written after it.
  void commit();

  const std::string& path() const { return path_; }
  /// Bytes written so far.
  std::uint64_t size() const { return size_; }

 private:
  [[noreturn]] void fail(const std::string& what, int error);

  std::string path_;
  std::string temporary_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

/// Writes `bytes` to `path` through an AtomicFile.
///   write_file_atomically("runs/foodtag/models.yaml", text);
void write_file_atomically(const std::string& path, std::string_view bytes);

}  // namespace flowtrain
