#pragma once

#include <string>

namespace flowtrain::train {

/// A run's exclusive claim on a folder it writes (a checkpoint_dir), for the life of the object,
/// so that two runs into one folder cannot interleave their checkpoints and steps.csv: an
/// flock(2) on FOLDER/NAME, which holds the owner's pid for the message. The kernel releases it
/// when the process ends, however it ends, so a killed run leaves no stale lock.
///
///   FolderLock lock(checkpoint_dir, ".lock");  // throws if another run holds it
class FolderLock {
 public:
  /// Throws Error naming the folder and the pid of the process that holds the lock, or why the
  /// lock file cannot be opened.
  FolderLock(const std::string& folder, const std::string& name);
  ~FolderLock();
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace flowtrain::train
