#include "stages/train/step/optimizer.hpp"

#include <torch/torch.h>

#include <cmath>

namespace flowtrain::train {

std::unique_ptr<torch::optim::AdamW> make_adamw(
    const std::vector<std::pair<std::string, torch::Tensor>>& params,
    const OptimizerOptions& options) {
  std::vector<torch::Tensor> decay, no_decay;
  for (const auto& [name, param] : params) {
    // Biases and LayerNorm parameters are 1-D; cls_token and pos_embed are embeddings.
    const bool embedding = name == "cls_token" || name == "pos_embed";
    (param.dim() >= 2 && !embedding ? decay : no_decay).push_back(param);
  }
  auto adamw = [&](double weight_decay) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(options.lr)
            .betas({options.beta1, options.beta2})
            .eps(options.eps)
            .weight_decay(weight_decay));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, adamw(options.weight_decay));
  groups.emplace_back(no_decay, adamw(0.0));
  return std::make_unique<torch::optim::AdamW>(std::move(groups),
                                               torch::optim::AdamWOptions(options.lr));
}

std::vector<std::pair<std::string, torch::Tensor>> named_parameters(const ImageModel& model) {
  std::vector<std::pair<std::string, torch::Tensor>> params;
  for (const auto& item : model->named_parameters()) params.emplace_back(item.key(), item.value());
  return params;
}

std::unique_ptr<torch::optim::AdamW> make_adamw(const ImageModel& model,
                                                const OptimizerOptions& options) {
  return make_adamw(named_parameters(model), options);
}

double scheduled_lr(const OptimizerOptions& options, std::uint64_t step, std::uint64_t total_steps) {
  if (step < options.warmup_steps) {
    return options.lr * static_cast<double>(step + 1) / static_cast<double>(options.warmup_steps);
  }
  if (step >= total_steps) return options.min_lr;
  const double span = static_cast<double>(total_steps - options.warmup_steps);
  const double progress = static_cast<double>(step - options.warmup_steps) / span;
  return options.min_lr + (options.lr - options.min_lr) * 0.5 * (1.0 + std::cos(M_PI * progress));
}

void set_lr(torch::optim::AdamW& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) {
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  }
}

}  // namespace flowtrain::train
