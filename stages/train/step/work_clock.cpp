#include "stages/train/step/work_clock.hpp"

#if FLOWTRAIN_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <cuda_runtime_api.h>
#endif

namespace flowtrain::train {

#if FLOWTRAIN_WITH_CUDA
struct WorkClock::Events {
  explicit Events(c10::DeviceIndex d) : device(d) {}
  c10::DeviceIndex device;
  at::cuda::CUDAEvent start{cudaEventDefault};  // with timing (the default flags have none)
  std::array<at::cuda::CUDAEvent, kMarks> marks{
      at::cuda::CUDAEvent{cudaEventDefault}, at::cuda::CUDAEvent{cudaEventDefault},
      at::cuda::CUDAEvent{cudaEventDefault}, at::cuda::CUDAEvent{cudaEventDefault}};
};
#else
struct WorkClock::Events {};
#endif

WorkClock::WorkClock([[maybe_unused]] const c10::Device& device) {
#if FLOWTRAIN_WITH_CUDA
  if (device.is_cuda()) events_ = std::make_unique<Events>(device.index());
#endif
}

WorkClock::~WorkClock() = default;

WorkClock::Clock::time_point WorkClock::start() {
  start_ = Clock::now();
  last_ = -1;
#if FLOWTRAIN_WITH_CUDA
  if (events_) events_->start.record(at::cuda::getCurrentCUDAStream(events_->device));
#endif
  return start_;
}

void WorkClock::mark(int i) {
  last_ = i;
  host_[static_cast<std::size_t>(i)] = Clock::now();
#if FLOWTRAIN_WITH_CUDA
  if (events_) {
    events_->marks[static_cast<std::size_t>(i)].record(
        at::cuda::getCurrentCUDAStream(events_->device));
  }
#endif
}

std::array<WorkClock::Clock::time_point, WorkClock::kMarks> WorkClock::finish() {
#if FLOWTRAIN_WITH_CUDA
  if (events_ && last_ >= 0) {
    events_->marks[static_cast<std::size_t>(last_)].synchronize();
    std::array<Clock::time_point, kMarks> device{};
    for (int i = 0; i <= last_; ++i) {
      const double ms =
          events_->start.elapsed_time(events_->marks[static_cast<std::size_t>(i)]);
      device[static_cast<std::size_t>(i)] =
          start_ + std::chrono::duration_cast<Clock::duration>(
                       std::chrono::duration<double, std::milli>(ms));
    }
    return device;
  }
#endif
  return host_;
}

}  // namespace flowtrain::train
