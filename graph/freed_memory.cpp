#include "graph/freed_memory.hpp"

#include <climits>
#include <cstdlib>
#include <cstring>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace flowtrain {

namespace {

// Whether the environment sets malloc's mmap or trim threshold (then it has the last word).
bool environment_sets_thresholds() {
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") != nullptr ||
      std::getenv("MALLOC_TRIM_THRESHOLD_") != nullptr) {
    return true;
  }
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  return tunables != nullptr && (std::strstr(tunables, "glibc.malloc.mmap_threshold") != nullptr ||
                                 std::strstr(tunables, "glibc.malloc.trim_threshold") != nullptr);
}

}  // namespace

bool keep_freed_memory() {
#if defined(__GLIBC__)
  if (environment_sets_thresholds()) return false;
  // 32 MB is the largest mmap threshold glibc takes on 64-bit (half its heap size); setting
  // either threshold also stops glibc from adapting them.
  return mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1 && mallopt(M_TRIM_THRESHOLD, INT_MAX) == 1;
#else
  return false;
#endif
}

void release_freed_memory() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

}  // namespace flowtrain
