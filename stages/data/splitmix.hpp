#pragma once

#include <cstdint>
#include <cstring>
#include <span>

namespace flowtrain::data {

/// splitmix64's finaliser: a well-mixed 64-bit hash, the same on every platform. Random draws
/// keyed by (seed, epoch, index) chain it: splitmix64(seed ^ splitmix64(epoch ^ ...)).
inline std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/// A 64-bit hash of `bytes`, 8 at a time through splitmix64, seeded by `seed`: checksums,
/// view digests, pixel recipes and file fingerprints.
inline std::uint64_t hash_bytes(std::span<const std::uint8_t> bytes, std::uint64_t seed = 0) {
  std::uint64_t h = splitmix64(seed ^ bytes.size());
  std::size_t i = 0;
  for (; i + 8 <= bytes.size(); i += 8) {
    std::uint64_t word;
    std::memcpy(&word, bytes.data() + i, 8);
    h = splitmix64(h ^ word);
  }
  std::uint64_t tail = 0;
  if (i < bytes.size()) std::memcpy(&tail, bytes.data() + i, bytes.size() - i);
  return splitmix64(h ^ tail ^ (static_cast<std::uint64_t>(bytes.size() - i) << 56));
}

}  // namespace flowtrain::data
