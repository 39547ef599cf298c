#pragma once

#include <cstdint>

namespace flowtrain::train {

/// Counts the CPU tensor memory that threads allocate, by slot: while a thread holds a
/// `CountThreadMemory` for slot s, every CPU tensor it allocates counts towards s until it is
/// freed, by whichever thread. A pipeline partition's thread counts into the partition's slot,
/// so the slot's peak above its start is what the partition held at once: the activations it
/// keeps for backward and its transient workspace. Slots are process-wide (kSlots of them, never
/// destroyed, as counted tensors may outlive whoever counted them).
///
/// Counting needs a CPU allocator in front of LibTorch's (a 64-byte header per allocation, a
/// thread-local read and an atomic add; tensors made before keep their own deleter), installed
/// by install_memory_counting(), once, best before other threads allocate (LibTorch's allocator
/// pointer is swapped unsynchronised): a Trainer with a pipeline does it when built. Nothing is
/// installed in a process that never counts.
///
///   CountThreadMemory count(partition);
///   const std::int64_t start = thread_memory_live(partition);
///   thread_memory_reset_peak(partition);
///   ... forwards and backwards ...
///   const std::int64_t held = thread_memory_peak(partition) - start;
class CountThreadMemory {
 public:
  static constexpr int kSlots = 64;
  explicit CountThreadMemory(int slot);  // slot in [0, kSlots); installs counting if not yet
  ~CountThreadMemory();
  CountThreadMemory(const CountThreadMemory&) = delete;
  CountThreadMemory& operator=(const CountThreadMemory&) = delete;

 private:
  int previous_;
};

/// Puts the counting allocator in front of LibTorch's CPU one; later calls do nothing.
void install_memory_counting();

/// Bytes counted to `slot` and not yet freed.
std::int64_t thread_memory_live(int slot);
/// The most bytes `slot` held at once since its last reset.
std::int64_t thread_memory_peak(int slot);
/// Starts a new peak from the bytes live now.
void thread_memory_reset_peak(int slot);

}  // namespace flowtrain::train
