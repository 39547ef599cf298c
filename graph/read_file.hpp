#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace flowtrain {

/// The largest file read_file reads unless told otherwise: 256 MiB (a path that leads to
/// something endless must not eat the memory).
inline constexpr std::int64_t kMaxFileBytes = std::int64_t{256} << 20;

/// Reads the whole file at `path` into `buffer`, which only grows, so a reused buffer is not
/// reallocated; `bytes` views what was read. Returns why it could not ("it is a FIFO, not a
/// regular file", "larger than max_file_bytes 268435456", the system's reason), or an empty
/// string. Never blocks on a FIFO or a device and never reads past `max_bytes`. The one reader of
/// whole files: configs, images (jpeg_decode, decode_crop, pack), manifests; large files that
/// are checked before they are trusted (weights, checkpoints) are mapped instead (MappedFile).
///   std::vector<std::uint8_t> buffer;
///   std::span<const std::uint8_t> bytes;
///   if (std::string error = read_file(path, buffer, bytes); !error.empty()) fail(path, error);
std::string read_file(const std::string& path,
                      std::vector<std::uint8_t>& buffer,
                      std::span<const std::uint8_t>& bytes,
                      std::int64_t max_bytes = kMaxFileBytes);

/// The whole text of the file at `path`, for a reader that names what it reads: throws Error
/// "cannot read WHAT 'PATH': REASON" in plain words ("no such file", "permission denied", "it
/// is a folder, not a regular file", "it is larger than 4 MiB, the most a WHAT may be").
///   const std::string text = read_text_file(path, "config", 4 << 20);
std::string read_text_file(const std::string& path,
                           const std::string& what,
                           std::int64_t max_bytes = kMaxFileBytes);

/// A regular file mapped read-only, for readers of large files (weights, checkpoints) that look
/// at a few parts before trusting the rest: pages the reader never touches cost no memory, and
/// `release` gives back those it has read (a check streaming over a 4 GiB entry stays small).
/// Throws Error "PATH: cannot read (REASON)" if it is not a regular file or cannot be mapped.
/// The file must not shrink while mapped (flowtrain replaces its files by renaming, which keeps
/// a mapping's file whole).
///   MappedFile file(path);
///   check(file.bytes());
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  MappedFile& operator=(MappedFile&&) = delete;

  std::span<const std::uint8_t> bytes() const { return {data_, size_}; }
  /// Drops the pages of `part` (a part of bytes()) from this process's memory; reading them
  /// again reads the file again.
  void release(std::span<const std::uint8_t> part) const;

 private:
  const std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace flowtrain
