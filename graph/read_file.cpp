#include "graph/read_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "graph/error.hpp"

namespace flowtrain {

std::string read_file(const std::string& path,
                      std::vector<std::uint8_t>& buffer,
                      std::span<const std::uint8_t>& bytes,
                      std::int64_t max_bytes) {
  const auto last_error = [] { return std::string(std::strerror(errno)); };
  const std::string too_big = "larger than max_file_bytes " + std::to_string(max_bytes);
  // O_NONBLOCK: opening a FIFO must not wait for a writer (for a regular file it does nothing).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return last_error();
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat status {};
  if (::fstat(fd, &status) != 0) return last_error();
  if (!S_ISREG(status.st_mode)) {
    return std::string("it is ") +
           (S_ISDIR(status.st_mode)    ? "a folder"
            : S_ISFIFO(status.st_mode) ? "a FIFO"
            : S_ISCHR(status.st_mode)  ? "a character device"
            : S_ISBLK(status.st_mode)  ? "a block device"
                                       : "a socket") +
           ", not a regular file";
  }
  if (status.st_size > max_bytes) return too_big;
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
    if (size > static_cast<std::size_t>(max_bytes)) return too_big;
  }
  bytes = std::span<const std::uint8_t>(buffer.data(), size);
  return {};
}

std::string read_text_file(const std::string& path,
                           const std::string& what,
                           std::int64_t max_bytes) {
  std::vector<std::uint8_t> buffer;
  std::span<const std::uint8_t> bytes;
  std::string error = read_file(path, buffer, bytes, max_bytes);
  if (error.empty()) return {bytes.begin(), bytes.end()};
  if (error == std::strerror(ENOENT)) {
    error = "no such file";
  } else if (error == std::strerror(EACCES)) {
    error = "permission denied";
  } else if (error.rfind("larger than", 0) == 0) {
    error = "it is larger than " + std::to_string(max_bytes >> 20) + " MiB, the most a " + what +
            " may be";
  }
  throw Error("cannot read " + what + " '" + path + "': " + error);
}

}  // namespace flowtrain
