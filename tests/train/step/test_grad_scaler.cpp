// Loss scaling for float16 (GradScaler): its bookkeeping, which runs on the CPU although the
// float16 training it serves needs a GPU; and what the CPU refuses.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "graph/error.hpp"
#include "stages/train/files/checkpoint.hpp"
#include "stages/train/step/grad_scaler.hpp"
#include "stages/train/step/trainer.hpp"
#include "tests/temp_dir.hpp"

using namespace flowtrain;
using namespace flowtrain::train;

namespace {

// Two parameters with gradients as backward on a scaled loss leaves them.
std::vector<torch::Tensor> parameters_with_grads(double scale, double inject = 1.0) {
  torch::Tensor a = torch::zeros({3}, torch::requires_grad());
  torch::Tensor b = torch::zeros({2, 2}, torch::requires_grad());
  a.mutable_grad() = torch::tensor({0.5, -0.25, 0.125}) * scale;
  b.mutable_grad() = torch::full({2, 2}, 0.0625) * scale;
  b.mutable_grad()[1][0] = inject;  // an overflow of float16: inf, or NaN
  return {a, b};
}

// What the trainer does after the gradient sync: unscale, take the norm, skip if not finite.
bool step_found_inf(GradScaler& scaler, const std::vector<torch::Tensor>& params) {
  scaler.unscale(params);
  const double norm =
      torch::nn::utils::clip_grad_norm_(params, std::numeric_limits<double>::infinity());
  const bool found_inf = !std::isfinite(norm);
  scaler.update(found_inf);
  return found_inf;
}

}  // namespace

TEST_CASE("Train.GradScaler.UnscalesToTheTrueGradients") {
  GradScaler scaler({});
  CHECK(scaler.scale() == 65536.0);  // torch.cuda.amp.GradScaler's init_scale
  const std::vector<torch::Tensor> params = parameters_with_grads(scaler.scale(), 0.0625 * 65536);
  scaler.unscale(params);
  CHECK(torch::equal(params[0].grad(), torch::tensor({0.5, -0.25, 0.125})));
  CHECK(torch::equal(params[1].grad(), torch::full({2, 2}, 0.0625)));
}

TEST_CASE("Train.GradScaler.InjectedInfOrNanSkipsAndBacksOff") {
  GradScaler scaler({.init_scale = 1024, .growth_interval = 3});
  CHECK_FALSE(step_found_inf(scaler, parameters_with_grads(scaler.scale(), 1.0)));
  CHECK(scaler.growth_tracker() == 1);
  for (const double bad : {std::numeric_limits<double>::infinity(), std::nan("")}) {
    CHECK(step_found_inf(scaler, parameters_with_grads(scaler.scale(), bad)));
    CHECK(scaler.growth_tracker() == 0);  // the run of good steps starts again
  }
  CHECK(scaler.scale() == 256);  // halved twice
}

TEST_CASE("Train.GradScaler.GrowsAfterGrowthIntervalGoodSteps") {
  GradScaler scaler({.init_scale = 8, .growth_factor = 2, .growth_interval = 3});
  const std::vector<double> expected = {8, 8, 16, 16, 16, 32};
  for (const double scale : expected) {
    CHECK_FALSE(step_found_inf(scaler, parameters_with_grads(scaler.scale())));
    CHECK(scaler.scale() == scale);
  }
  scaler.update(/*found_inf=*/true);
  CHECK(scaler.scale() == 16);
}

TEST_CASE("Train.GradScaler.RefusesSettingsThatCannotScale") {
  CHECK_THROWS_AS(GradScaler({.init_scale = 0}), Error);
  CHECK_THROWS_AS(GradScaler({.growth_factor = 1}), Error);
  CHECK_THROWS_AS(GradScaler({.backoff_factor = 1}), Error);
  CHECK_THROWS_AS(GradScaler({.growth_interval = 0}), Error);
  GradScaler scaler({});
  CHECK_THROWS_AS(scaler.restore(-1, 0), Error);
  scaler.restore(128, 5);
  CHECK(scaler.scale() == 128);
  CHECK(scaler.growth_tracker() == 5);
}

TEST_CASE("Train.GradScaler.StateTravelsInCheckpoints") {
  // A run with loss scaling writes its scale and tracker; a resumed one reads them back. A
  // run without writes neither (its files are as before).
  testing::TempDir dir("flowtrain-grad-scaler");
  torch::manual_seed(1);
  ImageModel model = make_model(ModelConfig{.image_size = 16, .patch_size = 8, .dim = 16,
                                            .depth = 1, .heads = 2, .classes = 3});
  TrainState state;
  state.loss_scale = 2048;
  state.loss_scale_growth = 17;
  save_checkpoint(dir.path() / "scaled.pt", model, nullptr, state);
  const Checkpoint scaled = read_checkpoint(dir.path() / "scaled.pt");
  CHECK(scaled.state.loss_scale == 2048);
  CHECK(scaled.state.loss_scale_growth == 17);
  save_checkpoint(dir.path() / "plain.pt", model, nullptr, {});
  const Checkpoint plain = read_checkpoint(dir.path() / "plain.pt");
  CHECK(plain.state.loss_scale == 0);
  c10::IValue absent;
  CHECK_FALSE(plain.archive.try_read("state.loss_scale", absent));
}

TEST_CASE("Train.GradScaler.Fp16IsRefusedOnTheCpu") {
  TrainerOptions options;
  options.model = ModelConfig{.image_size = 16, .patch_size = 8, .dim = 16, .depth = 1,
                              .heads = 2, .classes = 3};
  options.loss.alpha = 1;
  options.autocast = c10::kHalf;
  CHECK_THROWS_WITH_AS(
      Trainer{options},
      "param 'autocast': fp16 runs on a GPU (device cuda); on the CPU use bf16", Error);
}
