// keep_freed_memory: a training step's freed buffers come back without page faults.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "graph/cpu_usage.hpp"
#include "graph/freed_memory.hpp"

using namespace flowtrain;

namespace {

// Like a training step's activations: three 6 MB buffers allocated, written and freed.
void step() {
  std::vector<char*> buffers;
  for (int b = 0; b < 3; ++b) {
    buffers.push_back(static_cast<char*>(std::malloc(6 << 20)));
    std::memset(buffers.back(), b + 1, 6 << 20);
  }
  for (char* buffer : buffers) std::free(buffer);
}

}  // namespace

TEST_CASE("FreedMemory.TheNextStepsTakeNoPageFaults" * doctest::timeout(60)) {
  // The environment has the last word on malloc's thresholds.
  setenv("MALLOC_TRIM_THRESHOLD_", "131072", 1);
  CHECK_FALSE(keep_freed_memory());
  unsetenv("MALLOC_TRIM_THRESHOLD_");
  setenv("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=131072", 1);
  CHECK_FALSE(keep_freed_memory());
  unsetenv("GLIBC_TUNABLES");

  REQUIRE(keep_freed_memory());
  step();
  step();
  const std::uint64_t before = detail::process_page_faults();
  for (int s = 0; s < 8; ++s) step();
  // glibc's defaults return the 18 MB to the kernel after each step (about 4,600 page faults a
  // step here); kept, the 8 steps reuse the pages the first two faulted in.
  CHECK(detail::process_page_faults() - before < 500);
}
