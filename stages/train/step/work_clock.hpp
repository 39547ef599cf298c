#pragma once

#include <c10/core/Device.h>

#include <array>
#include <chrono>
#include <memory>

namespace flowtrain::train {

/// When a training step's parts ended, as the device ran them. On the CPU the work is done
/// when the call that does it returns, so a mark is the host clock then. On a GPU the host
/// returns as soon as the work is queued: a mark records a CUDA event on the calling thread's
/// current stream instead, and finish() waits for the last one and turns the events' elapsed
/// times into steady_clock points after start(). (Without CUDA in LibTorch only the first way
/// compiles.)
///
///   WorkClock clock(device);
///   out.begin = clock.start();
///   forward(); clock.mark(0);  backward(); clock.mark(1);  ...
///   const auto ends = clock.finish();  // ends[0]: the forward's end, ...
class WorkClock {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr int kMarks = 4;

  explicit WorkClock(const c10::Device& device);
  ~WorkClock();
  WorkClock(const WorkClock&) = delete;
  WorkClock& operator=(const WorkClock&) = delete;

  /// Starts a step's marks; returns the host time, which is also the device's start.
  Clock::time_point start();
  /// Marks the end of the work queued so far as mark `i` (0 <= i < kMarks).
  void mark(int i);
  /// Each mark's time (after waiting for the device to reach the last mark made).
  std::array<Clock::time_point, kMarks> finish();

 private:
  struct Events;  // on a GPU
  std::unique_ptr<Events> events_;
  Clock::time_point start_;
  std::array<Clock::time_point, kMarks> host_{};
  int last_ = -1;
};

}  // namespace flowtrain::train
