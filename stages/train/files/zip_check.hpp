#pragma once

// LibTorch's files (checkpoints, TorchScript models) are zip archives (tensors stored, code
// deflated), each entry with a CRC-32 that LibTorch 1.13 does not check: a damaged entry reaches
// its unpickler or TorchScript parser, which may throw anything or crash (found by fuzzing the
// checkpoint reader). Checking the CRCs first turns damage into one clear line.

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "graph/read_file.hpp"

namespace flowtrain::train {

/// An entry of a zip archive as its directory says, its data inside the archive's bytes.
struct ZipEntry {
  std::string_view name;
  std::uint32_t method = 0;  // 0 stored, 8 deflated
  std::uint32_t crc = 0;
  std::uint64_t size = 0;         // its contents' size (inflated)
  std::span<const std::uint8_t> data;  // as stored in the archive
};

/// The most a deflated entry may inflate to (LibTorch deflates only code and debug entries).
inline constexpr std::uint64_t kMaxInflatedEntry = std::uint64_t{256} << 20;

/// Drops pages of the archive once a check has read them (MappedFile::release), or nothing.
using ReleasePages = std::function<void(std::span<const std::uint8_t>)>;

/// The entries of the zip archive `bytes`, laid out as LibTorch reads them (entries in one folder
/// with a "version" entry holding a format version it supports; ZIP64 records read as its zip
/// reader reads them), each inside the archive: none is read. Sets `problem` and returns none if
/// not ("no zip directory", "entry 'x/data/3' runs past the end of the file").
std::vector<ZipEntry> zip_entries(std::span<const std::uint8_t> bytes, std::string& problem);

/// The entry `name` of the archive's folder ("data.pkl" finds "archive/data.pkl"), its case
/// ignored as LibTorch's zip reader ignores it; nullptr if there is none. `entries` are
/// zip_entries' (at least one).
const ZipEntry* find_entry(const std::vector<ZipEntry>& entries, std::string_view name);

/// Empty if `entry`'s contents match its CRC-32 and size, else what is wrong ("entry 'x' fails
/// its CRC check"); reads it in pieces (a deflated one into a small buffer), giving each piece
/// to `release` once read.
std::string entry_problem(const ZipEntry& entry, const ReleasePages& release = {});

/// `entry`'s contents, which must be `out.size()` bytes, into `out`, checked against its CRC-32
/// as they are read (each piece read given to `release`); returns the problem, or an empty
/// string.
std::string read_entry(const ZipEntry& entry,
                       std::span<std::uint8_t> out,
                       const ReleasePages& release = {});

/// Empty if `bytes` is a zip archive as zip_entries reads one whose entries all pass
/// entry_problem, else the first problem.
std::string zip_problem(std::span<const std::uint8_t> bytes, const ReleasePages& release = {});

/// Whether `bytes` end as a zip archive does (a zip reader, LibTorch's among them, looks for its
/// directory at the end, whatever the first bytes are).
bool has_zip_directory(std::span<const std::uint8_t> bytes);

/// `path` mapped (MappedFile) and checked as zip_problem does, if it is a zip archive at all
/// (else left to LibTorch, which names what it is not), streaming: a damaged entry of any size
/// costs no memory. Throws Error naming the path and the damage, or why it cannot be read.
///   const MappedFile file = read_checked_archive(path, "checkpoint");
MappedFile read_checked_archive(const std::string& path, const std::string& kind);

}  // namespace flowtrain::train
