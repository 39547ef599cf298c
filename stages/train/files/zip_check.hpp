#pragma once

// LibTorch's files (checkpoints, TorchScript models) are zip archives (tensors stored, code
// deflated), each entry with a CRC-32 that LibTorch 1.13 does not check: a damaged entry reaches
// its unpickler or TorchScript parser, which may throw anything or crash (found by fuzzing the
// checkpoint reader). Checking the CRCs first turns damage into one clear line.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace flowtrain::train {

/// Empty if `bytes` is a zip archive whose entries (stored, or deflated as LibTorch's code
/// entries are) all match their CRC-32 and size, laid out as LibTorch reads them (entries in one
/// folder with a "version" entry holding a format version it supports); else what is wrong
/// ("entry 'x/data/3' fails its CRC check", "no zip directory", "no entry 'x/version'"). ZIP64
/// records (LibTorch writes one into every file) are read as LibTorch's zip reader reads them:
/// the record's count and place of the directory, and each entry's ZIP64 sizes and offset.
std::string zip_problem(std::span<const std::uint8_t> bytes);

/// Reads `path` whole into `buffer` (bytes views it) and checks it as zip_problem does, if it is
/// a zip archive at all (else leaves it to LibTorch, which names what it is not). Throws Error
/// naming the path and the damage, or the reason it cannot be read.
///   std::vector<std::uint8_t> buffer; std::span<const std::uint8_t> bytes;
///   read_checked_archive(path, "checkpoint", buffer, bytes);
void read_checked_archive(const std::string& path,
                          const std::string& kind,
                          std::vector<std::uint8_t>& buffer,
                          std::span<const std::uint8_t>& bytes);

}  // namespace flowtrain::train
