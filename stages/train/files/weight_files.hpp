#pragma once

// The file formats behind weights.hpp, for stages/train's own use: safetensors
// (safetensors.cpp) and torch.save's zip (torch_save.cpp), and what they share.

#include <c10/util/ArrayRef.h>
#include <torch/types.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "stages/train/files/weights.hpp"
#include "stages/train/files/zip_check.hpp"

namespace flowtrain::train {

/// "[1000, 512]".
std::string shape_text(c10::IntArrayRef sizes);

/// A tensor of `dtype` and `shape` holding `bytes` (exactly its size), copied into memory of its
/// own (a file's bytes need not be aligned for the dtype).
torch::Tensor tensor_from_bytes(const std::uint8_t* bytes,
                                std::size_t size,
                                torch::ScalarType dtype,
                                const std::vector<std::int64_t>& shape);

/// The little-endian uint64 at `p` (8 bytes the caller has checked exist).
inline std::uint64_t read_u64_le(const std::uint8_t* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

/// Whether `bytes` begin as a safetensors file does (a plausible header size, then '{').
bool looks_like_safetensors(std::span<const std::uint8_t> bytes);

/// `weights` as a safetensors file (8-byte aligned data, names in their order).
std::string safetensors_bytes(const StateDict& weights);

/// The state_dict in the torch.save zip whose entries zip_entries listed, each storage checked
/// against the size its pickle gives before it is read, and every entry against its CRC (pieces
/// read are given to `release`); throws Error naming `path` and the reason.
StateDict read_torch_save(const std::vector<ZipEntry>& entries,
                          const std::string& path,
                          const ReleasePages& release = {});

}  // namespace flowtrain::train
