#include "graph/read_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "graph/error.hpp"

namespace flowtrain {

namespace {

// Why a read failed: the system's errno, or a reason of our own (not a regular file, too large).
struct ReadFailure {
  int error = 0;       // errno, or 0
  std::string reason;  // set when error is 0; empty when the read succeeded
  bool too_big = false;
  bool failed() const { return error != 0 || !reason.empty(); }
};

struct Closer {
  int fd;
  ~Closer() {
    if (fd >= 0) ::close(fd);
  }
};

// Opens `path` for reading if it is a regular file: `fd` (closed by its Closer) and its status.
ReadFailure open_regular(const std::string& path, Closer& closer, struct stat& status) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer (for a regular file it does nothing).
  closer.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (closer.fd < 0 || ::fstat(closer.fd, &status) != 0) return ReadFailure{.error = errno};
  if (!S_ISREG(status.st_mode)) {
    return {.reason = std::string("it is ") +
                      (S_ISDIR(status.st_mode)    ? "a folder"
                       : S_ISFIFO(status.st_mode) ? "a FIFO"
                       : S_ISCHR(status.st_mode)  ? "a character device"
                       : S_ISBLK(status.st_mode)  ? "a block device"
                                                  : "a socket") +
                      ", not a regular file"};
  }
  return {};
}

ReadFailure read_whole(const std::string& path,
                       std::vector<std::uint8_t>& buffer,
                       std::span<const std::uint8_t>& bytes,
                       std::int64_t max_bytes) {
  const auto last_error = [] { return ReadFailure{.error = errno}; };
  const auto too_big = [max_bytes] {
    return ReadFailure{.reason = "larger than max_file_bytes " + std::to_string(max_bytes),
                       .too_big = true};
  };
  Closer closer{-1};
  struct stat status {};
  if (ReadFailure failure = open_regular(path, closer, status); failure.failed()) return failure;
  const int fd = closer.fd;
  if (status.st_size > max_bytes) return too_big();
  // st_size is only a hint (files in /proc report 0, a file may grow meanwhile); the extra byte
  // lets the read that reports the end fit without growing the buffer.
  const auto hint = static_cast<std::size_t>(std::max<off_t>(status.st_size, 0)) + 1;
  if (buffer.size() < hint) buffer.resize(hint);
  std::size_t size = 0;
  for (;;) {
    if (size == buffer.size()) buffer.resize(buffer.size() * 2);
    const ssize_t n = ::read(fd, buffer.data() + size, buffer.size() - size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return last_error();
    if (n == 0) break;
    size += static_cast<std::size_t>(n);
    if (size > static_cast<std::size_t>(max_bytes)) return too_big();
  }
  bytes = std::span<const std::uint8_t>(buffer.data(), size);
  return {};
}

}  // namespace

std::string read_file(const std::string& path,
                      std::vector<std::uint8_t>& buffer,
                      std::span<const std::uint8_t>& bytes,
                      std::int64_t max_bytes) {
  const ReadFailure failure = read_whole(path, buffer, bytes, max_bytes);
  return failure.error != 0 ? std::string(std::strerror(failure.error)) : failure.reason;
}

std::string read_text_file(const std::string& path,
                           const std::string& what,
                           std::int64_t max_bytes) {
  std::vector<std::uint8_t> buffer;
  std::span<const std::uint8_t> bytes;
  const ReadFailure failure = read_whole(path, buffer, bytes, max_bytes);
  if (!failure.failed()) return {bytes.begin(), bytes.end()};
  std::string reason = failure.reason;
  if (failure.error == ENOENT) {
    reason = "no such file";
  } else if (failure.error == EACCES) {
    reason = "permission denied";
  } else if (failure.error != 0) {
    reason = std::strerror(failure.error);
  } else if (failure.too_big) {
    reason = "it is larger than " + std::to_string(max_bytes >> 20) + " MiB, the most a " + what +
             " may be";
  }
  throw Error("cannot read " + what + " '" + path + "': " + reason);
}

MappedFile::MappedFile(const std::string& path) {
  Closer closer{-1};
  struct stat status {};
  const ReadFailure failure = open_regular(path, closer, status);
  if (failure.failed()) {
    throw Error(path + ": cannot read (" +
                (failure.error != 0 ? std::string(std::strerror(failure.error)) : failure.reason) +
                ")");
  }
  size_ = static_cast<std::size_t>(std::max<off_t>(status.st_size, 0));
  if (size_ == 0) return;
  void* data = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, closer.fd, 0);
  if (data == MAP_FAILED) {
    throw Error(path + ": cannot read (" + std::string(std::strerror(errno)) + ")");
  }
  data_ = static_cast<const std::uint8_t*>(data);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<std::uint8_t*>(data_), size_);
}

void MappedFile::release(std::span<const std::uint8_t> part) const {
  if (!data_ || part.empty()) return;
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<std::uintptr_t>(part.data()) & ~(page - 1);
  const auto end = reinterpret_cast<std::uintptr_t>(part.data() + part.size());
  ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

}  // namespace flowtrain
