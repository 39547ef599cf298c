#include "stages/train/step/grad_scaler.hpp"

#include <torch/torch.h>

#include "graph/error.hpp"

namespace flowtrain::train {

GradScaler::GradScaler(const GradScalerOptions& options)
    : options_(options), scale_(options.init_scale) {
  if (!(options.init_scale > 0) || !(options.growth_factor > 1) ||
      !(options.backoff_factor > 0 && options.backoff_factor < 1) ||
      options.growth_interval < 1) {
    throw Error("loss scaling needs init_scale > 0, growth_factor > 1, backoff_factor in (0, 1) "
                "and growth_interval >= 1");
  }
}

void GradScaler::unscale(const std::vector<torch::Tensor>& params) const {
  torch::NoGradGuard no_grad;
  // As GradScaler: multiplied by the reciprocal computed in float32 (exact for powers of two).
  const double inverse = static_cast<double>(1.0f / static_cast<float>(scale_));
  for (const torch::Tensor& p : params) {
    if (p.grad().defined()) p.grad().mul_(inverse);
  }
}

void GradScaler::update(bool found_inf) {
  if (found_inf) {
    scale_ *= options_.backoff_factor;
    growth_tracker_ = 0;
    return;
  }
  if (++growth_tracker_ == options_.growth_interval) {
    scale_ *= options_.growth_factor;
    growth_tracker_ = 0;
  }
}

void GradScaler::restore(double scale, std::int64_t growth_tracker) {
  if (!(scale > 0) || growth_tracker < 0) {
    throw Error("a loss scale of " + std::to_string(scale) + " (growth tracker " +
                std::to_string(growth_tracker) + ") cannot be restored");
  }
  scale_ = scale;
  growth_tracker_ = growth_tracker;
}

}  // namespace flowtrain::train
