// The zip check in front of every LibTorch file we read (checkpoints, TorchScript models): any
// bytes get a verdict (empty, or what is damaged), never a crash or a read outside them. The
// checkpoint target goes on into LibTorch's own readers; this one has no LibTorch in it, so
// libFuzzer's coverage-guided build (clang) can run it.
#include <span>

#include "stages/train/files/zip_check.hpp"
#include "tests/fuzz/fuzz_target.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return flowtrain::fuzz::only_clear_errors(
      [&] { flowtrain::train::zip_problem(std::span<const std::uint8_t>(data, size)); });
}
