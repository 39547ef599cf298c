#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace flowtrain {

/// The largest file read_file reads unless told otherwise: 256 MiB (a path that leads to
/// something endless must not eat the memory).
inline constexpr std::int64_t kMaxFileBytes = std::int64_t{256} << 20;

/// Reads the whole file at `path` into `buffer`, which only grows, so a reused buffer is not
/// reallocated; `bytes` views what was read. Returns why it could not ("it is a FIFO, not a
/// regular file", "larger than max_file_bytes 268435456", the system's reason), or an empty
/// string. Never blocks on a FIFO or a device and never reads past `max_bytes`. The one reader of
/// whole files: configs, images (jpeg_decode, decode_crop, pack), checkpoints and weights.
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

}  // namespace flowtrain
