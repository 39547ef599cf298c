#include "stages/train/models/compute.hpp"

#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <omp.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "distributed/torch_compat.hpp"
#include "graph/error.hpp"

namespace flowtrain::train {

IntraOpThreads::IntraOpThreads(int threads) {
  // ATen initialises a thread's count lazily on first use, overwriting what was set before;
  // trigger that first. Then set OpenMP's per-thread count directly: at::set_num_threads would
  // also reset process-wide state (oneDNN's cache) that another stage may be using.
  at::get_num_threads();
  previous_ = omp_get_max_threads();
  if (threads != previous_) omp_set_num_threads(threads);
}

IntraOpThreads::~IntraOpThreads() {
  if (omp_get_max_threads() != previous_) omp_set_num_threads(previous_);
}

Autocast::Autocast(c10::ScalarType dtype, c10::DeviceType device)
    : enabled_(dtype != c10::kFloat), device_(device) {
  if (!enabled_) return;
  previous_ = dist::autocast_enabled(device_);
  previous_dtype_ = dist::autocast_dtype(device_);
  dist::set_autocast(device_, true, dtype);
}

Autocast::~Autocast() {
  if (!enabled_) return;
  dist::set_autocast(device_, previous_, previous_dtype_);
  if (!previous_) at::autocast::clear_cache();
}

NoAutocast::NoAutocast(c10::DeviceType device)
    : device_(device), previous_(dist::autocast_enabled(device)) {
  dist::set_autocast(device_, false, c10::kFloat);
}

NoAutocast::~NoAutocast() {
  dist::set_autocast(device_, previous_, dist::autocast_dtype(device_));
}

void check_autocast(c10::ScalarType dtype, const c10::Device& device) {
  if (dtype == c10::kHalf && !device.is_cuda()) {
    throw Error("param 'autocast': fp16 runs on a GPU (device cuda); on the CPU use bf16");
  }
}

bool cpu_has_bf16() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return false;
  __cpuid(1, eax, ebx, ecx, edx);
  if (((ecx >> 27) & 1) == 0) return false;  // no OSXSAVE: the OS saves no vector state
  // The state the OS saves (XCR0): AVX-512's opmask and ZMM registers, AMX's tiles.
  unsigned low = 0, high = 0;
  __asm__ volatile("xgetbv" : "=a"(low), "=d"(high) : "c"(0));
  const std::uint64_t xcr0 = (std::uint64_t{high} << 32) | low;
  const bool avx512_state = (xcr0 & 0xe6) == 0xe6;
  const bool amx_state = (xcr0 & 0x60000) == 0x60000;
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  const bool amx_bf16 = ((edx >> 22) & 1) != 0;
  const unsigned subleaves = eax;
  __cpuid_count(7, 1, eax, ebx, ecx, edx);
  const bool avx512_bf16 = subleaves >= 1 && ((eax >> 5) & 1) != 0;
  return (avx512_bf16 && avx512_state) || (amx_bf16 && amx_state);
#else
  return false;
#endif
}

std::string resolve_autocast(const std::string& autocast) {
  if (autocast != "auto") return autocast;
  static const bool bf16 = cpu_has_bf16();
  return bf16 ? "bf16" : "none";
}

c10::ScalarType autocast_dtype(const std::string& autocast, const c10::Device& device) {
  const std::string word = resolve_autocast(autocast);
  const c10::ScalarType dtype = word == "bf16"   ? c10::kBFloat16
                                : word == "fp16" ? c10::kHalf
                                                 : c10::kFloat;
  check_autocast(dtype, device);
  return dtype;
}

double matrix_rate_gflops(c10::ScalarType dtype, int threads) {
  static std::mutex mutex;
  static std::map<std::pair<c10::ScalarType, int>, double> measured;
  std::lock_guard lock(mutex);
  auto [at, added] = measured.try_emplace({dtype, threads}, 0.0);
  if (!added) return at->second;
  constexpr std::int64_t kSize = 1024;
  IntraOpThreads scope(threads);
  // Constant operands: no draw from the generators a run's results depend on.
  const at::Tensor a = at::full({kSize, kSize}, 0.5, at::TensorOptions().dtype(dtype));
  const at::Tensor b = at::full({kSize, kSize}, 0.25, at::TensorOptions().dtype(dtype));
  at::Tensor out = at::empty({kSize, kSize}, a.options());
  // Two products warm the kernels and the threads; then up to 7 are timed, as many as fit in
  // 0.2 s (where the kernels are slow, bf16 on a CPU without AVX-512, a product takes ~0.4 s).
  std::vector<double> seconds;
  double spent = 0;
  for (int i = 0; i < 9 && (i < 3 || spent < 0.2); ++i) {
    const auto start = std::chrono::steady_clock::now();
    at::mm_out(out, a, b);
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    if (i < 2) continue;
    seconds.push_back(took.count());
    spent += took.count();
  }
  const auto middle = seconds.begin() + static_cast<std::ptrdiff_t>(seconds.size() / 2);
  std::nth_element(seconds.begin(), middle, seconds.end());
  at->second = 2.0 * kSize * kSize * kSize / *middle / 1e9;
  return at->second;
}

}  // namespace flowtrain::train
