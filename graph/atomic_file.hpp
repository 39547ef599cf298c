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
/// throws Error("cannot write PATH: what failed (errno text)"); a `path` that exists and is not
/// a regular file is refused when the file is created and again before the rename
/// (check_replaceable).
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

/// Throws Error("cannot write PATH: it is a FIFO, not a regular file ...") when `path` exists and
/// is not a regular file (a device node, a FIFO, a socket, a folder): moving a file over it would
/// replace it, `/dev/full` with a regular file say. Every write-then-rename checks its target
/// with it (AtomicFile does). A symbolic link is judged by what it points to.
///   check_replaceable("/dev/full");  // throws: a character device
void check_replaceable(const std::string& path);

/// Throws the Error an AtomicFile for `path` would throw when created (the target is not a
/// regular file, its temporary cannot be created), and leaves nothing behind: for a file written
/// at the end of a long run, so that a bad path fails before the run rather than after it.
///   check_can_write_atomically(options.trace_path);
void check_can_write_atomically(const std::string& path);

/// Writes `bytes` to `path` through an AtomicFile.
///   write_file_atomically("runs/foodtag/models.yaml", text);
void write_file_atomically(const std::string& path, std::string_view bytes);

}  // namespace flowtrain
