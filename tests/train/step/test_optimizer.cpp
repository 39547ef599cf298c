#include <doctest/doctest.h>
#include <torch/torch.h>

#include "stages/train/models/vit.hpp"
#include "stages/train/step/optimizer.hpp"

using namespace flowtrain;
using namespace flowtrain::train;

TEST_CASE("Train.Schedule.WarmupThenCosine") {
  OptimizerOptions o;
  o.lr = 1.0;
  o.min_lr = 0.1;
  o.warmup_steps = 4;
  CHECK(scheduled_lr(o, 0, 20) == doctest::Approx(0.25));
  CHECK(scheduled_lr(o, 3, 20) == doctest::Approx(1.0));
  CHECK(scheduled_lr(o, 4, 20) == doctest::Approx(1.0));  // the cosine starts at the peak
  CHECK(scheduled_lr(o, 12, 20) == doctest::Approx(0.55));  // halfway: (1 + 0.1) / 2
  CHECK(scheduled_lr(o, 20, 20) == doctest::Approx(0.1));
  CHECK(scheduled_lr(o, 25, 20) == doctest::Approx(0.1));
}

TEST_CASE("Train.Optimizer.NoDecayOnBiasesNormsAndEmbeddings") {
  ViT model(ModelConfig{.image_size = 32, .patch_size = 8, .dim = 16, .depth = 1, .heads = 2,
                      .classes = 3});
  auto adamw = make_adamw(model, {});
  REQUIRE(adamw->param_groups().size() == 2);
  const auto& decay = adamw->param_groups()[0];
  const auto& no_decay = adamw->param_groups()[1];
  CHECK(static_cast<const torch::optim::AdamWOptions&>(decay.options()).weight_decay() == 0.05);
  CHECK(static_cast<const torch::optim::AdamWOptions&>(no_decay.options()).weight_decay() == 0);
  // Weight matrices: patch projection, qkv, proj, fc1, fc2, head.
  CHECK(decay.params().size() == 6);
  CHECK(decay.params().size() + no_decay.params().size() == model->parameters().size());
  for (const auto& p : decay.params()) CHECK(p.dim() >= 2);
}
