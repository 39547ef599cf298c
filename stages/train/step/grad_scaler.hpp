#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace flowtrain::train {

/// torch.cuda.amp.GradScaler's settings, with its defaults.
struct GradScalerOptions {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  std::int64_t growth_interval = 2000;
};

/// Dynamic loss scaling for float16 training, as torch.cuda.amp.GradScaler: backward runs on
/// the loss times `scale()`, so that small float16 gradients do not flush to zero; the
/// gradients are divided back before clipping and the optimizer. A step whose gradients hold
/// an inf or NaN is skipped and the scale multiplied by backoff_factor; after growth_interval
/// steps in a row without one, the scale is multiplied by growth_factor.
///
///   GradScaler scaler({});
///   (loss * scaler.scale()).backward();
///   scaler.unscale(params);                  // gradients / scale
///   const bool skip = !std::isfinite(grad_norm);
///   if (!skip) optimizer.step();
///   scaler.update(/*found_inf=*/skip);
class GradScaler {
 public:
  explicit GradScaler(const GradScalerOptions& options);

  double scale() const { return scale_; }
  /// Steps in a row without an inf or NaN gradient since the scale last changed.
  std::int64_t growth_tracker() const { return growth_tracker_; }
  /// Divides every defined gradient of `params` by the scale, in place.
  void unscale(const std::vector<torch::Tensor>& params) const;
  /// After a step: backs off on `found_inf`, else counts towards growth.
  void update(bool found_inf);
  /// Restores a checkpoint's scale and tracker (a resumed run scales as the uninterrupted one).
  void restore(double scale, std::int64_t growth_tracker);

 private:
  GradScalerOptions options_;
  double scale_;
  std::int64_t growth_tracker_ = 0;
};

}  // namespace flowtrain::train
