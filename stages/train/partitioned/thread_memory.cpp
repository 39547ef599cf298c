#include "stages/train/partitioned/thread_memory.hpp"

#include <c10/core/CPUAllocator.h>

#include <array>
#include <atomic>
#include <mutex>
#include <string>

#include "distributed/torch_compat.hpp"
#include "graph/error.hpp"

namespace flowtrain::train {

namespace {

struct Slot {
  std::atomic<std::int64_t> live{0};
  std::atomic<std::int64_t> peak{0};
};
std::array<Slot, CountThreadMemory::kSlots> g_slots;
thread_local int t_slot = -1;  // the slot this thread's allocations count towards

// Before each allocation's data, keeping LibTorch's 64-byte alignment: who counts it, how much.
struct alignas(64) Header {
  std::int64_t bytes;
  int slot;
};
static_assert(sizeof(Header) == 64);

c10::Allocator* g_base = nullptr;  // LibTorch's CPU allocator, behind ours

void release(void* data) {
  Header* header = static_cast<Header*>(data) - 1;
  if (header->slot >= 0) g_slots[static_cast<std::size_t>(header->slot)].live -= header->bytes;
  g_base->raw_deallocate(header);
}

// Data and context are one pointer, as raw_allocate requires of a CPU allocator.
struct CountingAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) FLOWTRAIN_ALLOCATE_CONST override {
    auto* header = static_cast<Header*>(g_base->raw_allocate(n + sizeof(Header)));
    header->bytes = static_cast<std::int64_t>(n);
    header->slot = t_slot;
    if (t_slot >= 0) {
      Slot& s = g_slots[static_cast<std::size_t>(t_slot)];
      const std::int64_t live = s.live += header->bytes;
      std::int64_t peak = s.peak.load(std::memory_order_relaxed);
      while (live > peak && !s.peak.compare_exchange_weak(peak, live)) {
      }
    }
    void* data = header + 1;
    return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
#if FLOWTRAIN_TORCH_AT_LEAST(2, 3)
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#endif
};

CountingAllocator g_counting;

Slot& slot_at(int slot) {
  if (slot < 0 || slot >= CountThreadMemory::kSlots) {
    throw Error("thread memory slot " + std::to_string(slot) + " is outside [0, " +
                std::to_string(CountThreadMemory::kSlots) + ")");
  }
  return g_slots[static_cast<std::size_t>(slot)];
}

}  // namespace

void install_memory_counting() {
  static std::once_flag installed;
  std::call_once(installed, [] {
    g_base = c10::GetCPUAllocator();
    c10::SetCPUAllocator(&g_counting, /*priority=*/1);
  });
}

CountThreadMemory::CountThreadMemory(int slot) : previous_(t_slot) {
  slot_at(slot);
  install_memory_counting();
  t_slot = slot;
}

CountThreadMemory::~CountThreadMemory() { t_slot = previous_; }

std::int64_t thread_memory_live(int slot) { return slot_at(slot).live.load(); }
std::int64_t thread_memory_peak(int slot) { return slot_at(slot).peak.load(); }
void thread_memory_reset_peak(int slot) {
  Slot& s = slot_at(slot);
  s.peak = s.live.load();
}

}  // namespace flowtrain::train
