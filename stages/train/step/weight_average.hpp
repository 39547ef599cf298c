#pragma once

#include <cstdint>

#include "stages/train/models/model.hpp"

namespace flowtrain::train {

/// An exponential moving average of a model's weights: its parameters and floating-point
/// buffers (BatchNorm's running statistics), as torch.optim.swa_utils.AveragedModel keeps one
/// with get_ema_multi_avg_fn and use_buffers=True. After optimizer step t (1, 2, ...):
///
///   average = lerp(average, weights, 1 - d_t),   d_t = min(decay, (1 + t) / (10 + t))
///
/// d_t is the warm-up of TensorFlow's ExponentialMovingAverage with num_updates, so that the
/// first weights do not dominate a short run. Other buffers (counters) are copied.
///
///   WeightAverage average(model, 0.99);
///   optimizer.step();
///   average.update(model, ++step);
///   average.model()->eval();  // evaluate or save the averaged weights
class WeightAverage {
 public:
  /// Starts as a copy of `model`'s weights; does not draw from the global generator.
  WeightAverage(const ImageModel& model, double decay);

  /// Moves the average towards `model`'s weights after optimizer step `step` (from 1).
  void update(const ImageModel& model, std::uint64_t step);
  /// Makes the average a copy of `model`'s weights.
  void reset(const ImageModel& model);

  /// The averaged weights, as a model of the same config (a holder sharing them).
  ImageModel model() const { return average_; }
  double decay() const { return decay_; }
  /// d_t above.
  double decay_at(std::uint64_t step) const;

 private:
  ImageModel average_{nullptr};
  double decay_;
};

}  // namespace flowtrain::train
