#include "graph/atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "graph/error.hpp"

namespace flowtrain {

namespace {

const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  return "a special file";
}

}  // namespace

void check_replaceable(const std::string& path) {
  struct stat st {};
  // Absent (or unreachable: creating or moving the file then says why).
  if (::stat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode)) return;
  throw Error("cannot write " + path + ": it is " + file_kind(st.st_mode) +
              ", not a regular file (moving a new file there would replace it)");
}

void check_can_write_atomically(const std::string& path) {
  AtomicFile probe(path);  // creates the temporary; destroyed uncommitted, it removes it
}

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)), temporary_(path_ + ".tmp") {
  check_replaceable(path_);
  fd_ = ::open(temporary_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("cannot create " + temporary_, errno);
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    std::remove(temporary_.c_str());
  }
}

void AtomicFile::fail(const std::string& what, int error) {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
    std::remove(temporary_.c_str());
  }
  throw Error("cannot write " + path_ + ": " + what + " (" + std::strerror(error) + ")");
}

void AtomicFile::write(const void* data, std::size_t size) {
  if (fd_ < 0) throw Error("cannot write " + path_ + ": written after commit");
  const char* bytes = static_cast<const char*>(data);
  for (std::size_t done = 0; done < size;) {
    const ssize_t n = ::write(fd_, bytes + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("writing " + temporary_ + " failed", n == 0 ? ENOSPC : errno);
    done += static_cast<std::size_t>(n);
  }
  size_ += size;
}

void AtomicFile::commit() {
  if (fd_ < 0) throw Error("cannot write " + path_ + ": committed twice");
  if (::fsync(fd_) != 0) fail("flushing " + temporary_ + " failed", errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    const int error = errno;
    std::remove(temporary_.c_str());
    fail("flushing " + temporary_ + " failed", error);
  }
  try {
    check_replaceable(path_);  // something may have appeared there since the file was created
  } catch (...) {
    std::remove(temporary_.c_str());
    throw;
  }
  if (std::rename(temporary_.c_str(), path_.c_str()) != 0) {
    const int error = errno;
    std::remove(temporary_.c_str());
    fail("cannot move " + temporary_ + " into place", error);
  }
  // The rename itself is durable only once the folder is.
  const std::filesystem::path folder = std::filesystem::path(path_).parent_path();
  const int dir = ::open(folder.empty() ? "." : folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  // Some file systems (FUSE, network) cannot fsync a folder: the file is in place all the same.
  if (dir < 0 || (::fsync(dir) != 0 && errno != EINVAL && errno != ENOTSUP)) {
    const int error = errno;
    if (dir >= 0) ::close(dir);
    fail("fsync of its folder failed", error);
  }
  ::close(dir);
}

void write_file_atomically(const std::string& path, std::string_view bytes) {
  AtomicFile file(path);
  file.write(bytes);
  file.commit();
}

}  // namespace flowtrain
