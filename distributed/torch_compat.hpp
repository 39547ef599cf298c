#pragma once

// The few C++ APIs of LibTorch that flowtrain uses and that changed between Debian's LibTorch
// 1.13 and LibTorch 2.x (a downloaded LibTorch, or pip torch's `torch/share/cmake`): each
// difference is one guard here, and the code elsewhere is written once against these names.
// Checked against 1.13.1 (Debian 12) and 2.11.0 (pip, CUDA 13): docs/gpu.md.

#include <ATen/autocast_mode.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Logging.h>
#include <torch/version.h>

#include <cstdint>
#include <cstdlib>

#define FLOWTRAIN_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||            \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace c10d {
class ProcessGroup;
class Backend;
}  // namespace c10d

namespace flowtrain::dist {

/// The process-group type that Gloo and NCCL implement and collectives are called on: 1.13's
/// c10d::ProcessGroup; from 2.0, c10d::Backend (ProcessGroup became a front over backends).
#if FLOWTRAIN_TORCH_AT_LEAST(2, 0)
using Group = c10d::Backend;
#else
using Group = c10d::ProcessGroup;
#endif

/// Keeps c10's log to fatal messages while in scope, unless the user asked for its log
/// (GLOG_minloglevel with 1.13's glog, TORCH_CPP_LOG_LEVEL with 2.x's own logging).
class QuietTorchLog {
 public:
  QuietTorchLog() {
#ifdef C10_USE_GLOG
    if (!std::getenv("GLOG_minloglevel")) FLAGS_minloglevel = google::GLOG_FATAL;
#else
    if (!std::getenv("TORCH_CPP_LOG_LEVEL")) FLAGS_caffe2_log_level = c10::GLOG_FATAL;
#endif
  }
  ~QuietTorchLog() { level() = saved_; }
  QuietTorchLog(const QuietTorchLog&) = delete;
  QuietTorchLog& operator=(const QuietTorchLog&) = delete;

 private:
  static int& level() {
#ifdef C10_USE_GLOG
    return FLAGS_minloglevel;
#else
    return FLAGS_caffe2_log_level;
#endif
  }
  int saved_ = level();
};

/// Whether autocast is on for `device` on this thread, and turning it on with `dtype` or off
/// (2.4 made the device type an argument; 1.13 has a function per device).
inline bool autocast_enabled(c10::DeviceType device) {
#if FLOWTRAIN_TORCH_AT_LEAST(2, 4)
  return at::autocast::is_autocast_enabled(device);
#else
  return device == c10::DeviceType::CUDA ? at::autocast::is_enabled()
                                         : at::autocast::is_cpu_enabled();
#endif
}

inline void set_autocast(c10::DeviceType device, bool enabled, c10::ScalarType dtype) {
#if FLOWTRAIN_TORCH_AT_LEAST(2, 4)
  if (enabled) at::autocast::set_autocast_dtype(device, dtype);
  at::autocast::set_autocast_enabled(device, enabled);
#else
  if (device == c10::DeviceType::CUDA) {
    if (enabled) at::autocast::set_autocast_gpu_dtype(dtype);
    at::autocast::set_enabled(enabled);
  } else {
    if (enabled) at::autocast::set_autocast_cpu_dtype(dtype);
    at::autocast::set_cpu_enabled(enabled);
  }
#endif
}

inline c10::ScalarType autocast_dtype(c10::DeviceType device) {
#if FLOWTRAIN_TORCH_AT_LEAST(2, 4)
  return at::autocast::get_autocast_dtype(device);
#else
  return device == c10::DeviceType::CUDA ? at::autocast::get_autocast_gpu_dtype()
                                         : at::autocast::get_autocast_cpu_dtype();
#endif
}

/// A profiler event's (torch::autograd::profiler::KinetoEvent) start and duration in
/// microseconds: 2.x counts them in nanoseconds (startNs, durationNs), 1.13 in microseconds.
template <class KinetoEvent>
std::uint64_t event_start_us(const KinetoEvent& e) {
  if constexpr (requires { e.startNs(); }) {
    return e.startNs() / 1000;
  } else {
    return e.startUs();
  }
}
template <class KinetoEvent>
std::uint64_t event_duration_us(const KinetoEvent& e) {
  if constexpr (requires { e.durationNs(); }) {
    return e.durationNs() / 1000;
  } else {
    return e.durationUs();
  }
}

}  // namespace flowtrain::dist

/// c10::Allocator::allocate lost its const in 2.3, which also added copy_data; an allocator
/// declares `c10::DataPtr allocate(size_t n) FLOWTRAIN_ALLOCATE_CONST override` and, from 2.3,
/// copy_data.
#if FLOWTRAIN_TORCH_AT_LEAST(2, 3)
#define FLOWTRAIN_ALLOCATE_CONST
#else
#define FLOWTRAIN_ALLOCATE_CONST const
#endif
