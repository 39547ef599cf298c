#include "stages/train/files/folder_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "graph/error.hpp"

namespace flowtrain::train {

FolderLock::FolderLock(const std::string& folder, const std::string& name) {
  const std::string path = (std::filesystem::path(folder) / name).string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error("cannot open lock file " + path + ": " + std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    char owner[32] = {};
    const ssize_t n = ::pread(fd_, owner, sizeof owner - 1, 0);
    ::close(fd_);
    fd_ = -1;
    if (error != EWOULDBLOCK) throw Error("cannot lock " + path + ": " + std::strerror(error));
    const std::string pid = n > 0 ? std::string(owner, static_cast<std::size_t>(n)) : "unknown";
    throw Error(folder + " is in use by another run (pid " + pid.substr(0, pid.find('\n')) +
                "): wait for it to end, or give this run another folder");
  }
  // The lock is ours: record who holds it, for the message another run will print.
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) < 0) {
    // The pid is only for the message; the lock holds without it.
  }
}

FolderLock::~FolderLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

}  // namespace flowtrain::train
