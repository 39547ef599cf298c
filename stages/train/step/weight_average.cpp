#include "stages/train/step/weight_average.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <mutex>
#include <vector>

namespace flowtrain::train {

namespace {

/// The model's parameters, then its buffers, in registration order.
std::vector<torch::Tensor> weights_of(const ImageModel& model) {
  std::vector<torch::Tensor> out = model->parameters();
  for (const torch::Tensor& buffer : model->buffers()) out.push_back(buffer);
  return out;
}

}  // namespace

WeightAverage::WeightAverage(const ImageModel& model, double decay) : decay_(decay) {
  // make_model draws initial weights from the global generator; training's own draws must not
  // depend on whether weights are averaged.
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  torch::Tensor state;
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    state = generator.get_state();
  }
  average_ = make_model(model->config());
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(state);
  }
  for (const torch::Tensor& p : average_->parameters()) p.requires_grad_(false);
  reset(model);
}

double WeightAverage::decay_at(std::uint64_t step) const {
  const double t = static_cast<double>(step);
  return std::min(decay_, (1 + t) / (10 + t));
}

void WeightAverage::reset(const ImageModel& model) {
  torch::NoGradGuard no_grad;
  const std::vector<torch::Tensor> from = weights_of(model), to = weights_of(average_);
  for (std::size_t i = 0; i < to.size(); ++i) to[i].copy_(from[i]);
}

void WeightAverage::update(const ImageModel& model, std::uint64_t step) {
  torch::NoGradGuard no_grad;
  const double weight = 1 - decay_at(step);
  const std::vector<torch::Tensor> from = weights_of(model), to = weights_of(average_);
  for (std::size_t i = 0; i < to.size(); ++i) {
    if (to[i].is_floating_point()) {
      to[i].lerp_(from[i], weight);
    } else {
      to[i].copy_(from[i]);
    }
  }
}

}  // namespace flowtrain::train
