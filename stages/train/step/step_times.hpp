#pragma once

// What one step of a train_step node cost, typed, for the tools that read a run's report
// (foodtag's profile line, bench_kd) without spelling its result names. TrainStepStage::results
// writes those results under the names below. No LibTorch.

#include <optional>
#include <string_view>

#include "graph/report.hpp"

namespace flowtrain {

/// The names of a train_step's results that StepTimes reads.
namespace step_result {
inline constexpr char kSteps[] = "steps";
inline constexpr char kImages[] = "images";
inline constexpr char kDataWait[] = "data_wait_ms";
inline constexpr char kForward[] = "forward_ms";
inline constexpr char kBackward[] = "backward_ms";
inline constexpr char kSyncWait[] = "sync_wait_ms";
inline constexpr char kOptimizer[] = "optimizer_ms";
inline constexpr char kGflops[] = "gflops";
}  // namespace step_result

/// The mean milliseconds of one step of a train_step node, by part, and what the run did.
struct StepTimes {
  const StageReport* stage = nullptr;  // the node: the entry's own, which runs forward and backward
  double steps = 0;                    // the training's steps so far, a resumed run's included
  double images = 0;                   // images trained on in this run
  double data_wait_ms = 0;             // waiting for the next batch (0 with one step)
  double forward_ms = 0;
  double backward_ms = 0;
  double sync_wait_ms = 0;  // waiting for the gradients' all-reduce (0 alone)
  double optimizer_ms = 0;
  std::optional<double> gflops;  // the matrix products' rate in forward and backward

  /// The step as its parts add up.
  double step_ms() const {
    return data_wait_ms + forward_ms + backward_ms + sync_wait_ms + optimizer_ms;
  }
};

/// The step times of `stage`, or std::nullopt if it is no train_step that took a step this run
/// (it reports no backward_ms).
inline std::optional<StepTimes> step_times(const StageReport& stage) {
  const auto value = [&](std::string_view name) -> std::optional<double> {
    for (const StageResult& r : stage.results) {
      if (r.name == name) return r.value;
    }
    return std::nullopt;
  };
  const std::optional<double> backward = value(step_result::kBackward);
  if (!backward) return std::nullopt;
  StepTimes t;
  t.stage = &stage;
  t.steps = value(step_result::kSteps).value_or(0);
  t.images = value(step_result::kImages).value_or(0);
  t.data_wait_ms = value(step_result::kDataWait).value_or(0);
  t.forward_ms = value(step_result::kForward).value_or(0);
  t.backward_ms = *backward;
  t.sync_wait_ms = value(step_result::kSyncWait).value_or(0);
  t.optimizer_ms = value(step_result::kOptimizer).value_or(0);
  t.gflops = value(step_result::kGflops);
  return t;
}

/// The step times of the last train_step of `report` that took a step, or std::nullopt.
inline std::optional<StepTimes> step_times(const RunReport& report) {
  std::optional<StepTimes> last;
  for (const StageReport& s : report.stages) {
    if (std::optional<StepTimes> t = step_times(s)) last = t;
  }
  return last;
}

}  // namespace flowtrain
