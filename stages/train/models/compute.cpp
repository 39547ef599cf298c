#include "stages/train/models/compute.hpp"

#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <omp.h>

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

c10::ScalarType autocast_dtype(const std::string& autocast, const c10::Device& device) {
  const c10::ScalarType dtype = autocast == "bf16"   ? c10::kBFloat16
                                : autocast == "fp16" ? c10::kHalf
                                                     : c10::kFloat;
  check_autocast(dtype, device);
  return dtype;
}

}  // namespace flowtrain::train
