#pragma once

#include <torch/optim/adamw.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "graph/options.hpp"
#include "stages/train/models/model.hpp"

namespace flowtrain::train {

/// AdamW and its learning-rate schedule: train_step's optimizer params (their keys flat in
/// YAML; the betas and eps are not params), with the same defaults.
struct OptimizerOptions {
  double lr = 1e-3;            // peak learning rate, reached at the end of warm-up
  double min_lr = 1e-5;        // the cosine decays to this at total_steps
  std::uint64_t warmup_steps = 0;
  double weight_decay = 0.05;  // on weight matrices only; biases, norms and embeddings get none
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;

  template <class Declare>
  void declare(Declare& d) {
    d(lr, "lr", "peak learning rate (AdamW)", {.min = 0});
    d(min_lr, "min_lr", "learning rate at the end of the cosine", {.min = 0});
    d(warmup_steps, "warmup_steps", "linear warm-up steps", {.min = 0});
    d(weight_decay, "weight_decay", "AdamW weight decay on weight matrices", {.min = 0});
  }
};

/// The model's parameters by name, in registration order: what make_adamw and ZeRO's shards
/// take.
std::vector<std::pair<std::string, torch::Tensor>> named_parameters(const ImageModel& model);

/// AdamW over the model's parameters in two groups, as timm and most ViT recipes do: weight
/// decay on the >= 2-D weights (linear and patch projections), none on biases, LayerNorm
/// parameters, the class token and the position embedding.
std::unique_ptr<torch::optim::AdamW> make_adamw(const ImageModel& model, const OptimizerOptions& options);

/// The same over some named parameters (a ZeRO shard): the names decide the groups.
std::unique_ptr<torch::optim::AdamW> make_adamw(
    const std::vector<std::pair<std::string, torch::Tensor>>& params,
    const OptimizerOptions& options);

/// The learning rate of step `step` (0-based) of `total_steps`: linear warm-up from lr /
/// warmup_steps to lr over the first warmup_steps steps, then a half cosine from lr down to
/// min_lr at total_steps (and min_lr after it).
///
///   double lr = scheduled_lr(options, step, total_steps);
double scheduled_lr(const OptimizerOptions& options, std::uint64_t step, std::uint64_t total_steps);

/// Sets every parameter group's learning rate.
void set_lr(torch::optim::AdamW& optimizer, double lr);

}  // namespace flowtrain::train
