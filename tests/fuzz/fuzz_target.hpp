#pragma once

// What every fuzz target shares: the contract (bad input may only end in flowtrain::Error, a
// clear message; anything else escaping is a finding) and a scratch file for readers that take
// a path.

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "graph/error.hpp"

namespace flowtrain::fuzz {

/// Runs `f`; a flowtrain::Error is the expected refusal of bad input. Any other exception leaves
/// LLVMFuzzerTestOneInput (extern "C"), which terminates: libFuzzer and the smoke driver report
/// it as a crash with the input.
template <class F>
int only_clear_errors(F&& f) {
  try {
    f();
  } catch (const Error&) {
  }
  return 0;
}

/// Writes the input to a file of this process (for readers that take a path) and returns it.
inline const std::string& scratch_file(const std::uint8_t* data, std::size_t size) {
  static const std::string path = "/tmp/flowtrain-fuzz-" + std::to_string(::getpid());
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  return path;
}

}  // namespace flowtrain::fuzz
