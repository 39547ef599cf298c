#pragma once

// The process's heap during training: memory freed is kept for the next allocations.

namespace flowtrain {

/// Makes glibc's malloc keep the memory this process frees for its next allocations, instead
/// of returning it to the kernel and faulting it in again, page by page, on the next step. A
/// training step frees and allocates tens of MB of activations and gradients each time; with
/// glibc's defaults (an mmap threshold that adapts, and the top of each heap trimmed past twice
/// that) foodtag's distill phase took 4.3 million page faults and ran 5-10% slower
/// (docs/benchmarks.md, "Freed memory kept"). Afterwards allocations under 32 MB come from
/// malloc's heaps and freed memory is not trimmed, so the resident memory stays near its peak.
///
/// Leaves malloc as it is, and returns false, where it is not glibc's or where the environment
/// sets these thresholds itself (`GLIBC_TUNABLES` naming `glibc.malloc.mmap_threshold` or
/// `glibc.malloc.trim_threshold`, `MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_`): they
/// have the last word. flowtrain's and foodtag's runs (runner::run_phases) call it
/// before their first phase; a C++ program that runs pipelines itself calls it at its start.
///   flowtrain::keep_freed_memory();
bool keep_freed_memory();

/// Returns the memory freed so far to the kernel (glibc's malloc_trim), for after work whose
/// buffers will not be needed again: autotune's rehearsals, whose pipelines ran on other
/// threads (so other malloc arenas) than the run after them; kept, they held 200 MB of
/// foodtag's tuned distill phase. A no-op where malloc is not glibc's.
void release_freed_memory();

}  // namespace flowtrain
