// WeightAverage through the Trainer: the averaged weights follow their recursion, leave the
// training itself untouched, travel in checkpoints (which inference then loads) and resume
// exactly.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <vector>

#include "graph/error.hpp"
#include "stages/train/step/trainer.hpp"
#include "tests/train/fixed_task.hpp"
#include "tests/train/training_fixture.hpp"

using namespace flowtrain;
using namespace flowtrain::train;
using flowtrain::testing::TempDir;

namespace {

TrainerOptions tiny(const std::string& arch, double ema_decay) {
  TrainerOptions options;
  if (arch == "resnet") {  // BatchNorm: running statistics to average too
    options.model = model_config("resnet18", 16, 3);
    options.model.dim = 4;
  } else {
    options.model = ModelConfig{.image_size = 16, .patch_size = 8, .dim = 16, .depth = 1,
                                .heads = 2, .classes = 3, .dropout = 0.1};
  }
  options.seed = 5;
  options.optimizer.lr = 1e-2;
  options.loss.alpha = 1;
  options.ema_decay = ema_decay;
  return options;
}

data::Batch batch(std::uint64_t number) { return flowtrain::testing::fixed_task_batch(number); }

/// Parameters, then buffers, as copies.
std::vector<torch::Tensor> weights(const ImageModel& model) {
  std::vector<torch::Tensor> out;
  for (const torch::Tensor& p : model->parameters()) out.push_back(p.detach().clone());
  for (const torch::Tensor& b : model->buffers()) out.push_back(b.clone());
  return out;
}

bool equal(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!torch::equal(a[i], b[i])) return false;
  }
  return true;
}

ImageModel reloaded_average(Trainer& trainer, const TempDir& dir) {
  const std::string path = dir / "model.pt";
  write_file_atomically(path, trainer.checkpoint(false));
  return load_model(read_checkpoint(path));
}

}  // namespace

TEST_CASE("Train.WeightAverage.FollowsItsRecursionAndLeavesTrainingAlone") {
  for (const std::string arch : {"vit", "resnet"}) {
    CAPTURE(arch);
    TempDir dir("weight-average");
    // The batches first (their seeds would reset the generator), then one trainer after the
    // other: both draw dropout masks from the global generator, which each seeds.
    std::vector<data::Batch> batches;
    for (std::uint64_t n = 0; n < 12; ++n) batches.push_back(batch(n));
    Trainer plain(tiny(arch, 0));
    plain.set_total_steps(12);
    for (const data::Batch& b : batches) plain.step(b);
    Trainer averaging(tiny(arch, 0.9));
    averaging.set_total_steps(12);
    std::vector<torch::Tensor> expected = weights(averaging.model());
    for (std::uint64_t n = 0; n < 12; ++n) {
      averaging.step(batches[n]);
      const double d = std::min(0.9, (1.0 + static_cast<double>(n + 1)) / (10.0 + n + 1));
      const std::vector<torch::Tensor> now = weights(averaging.model());
      for (std::size_t i = 0; i < expected.size(); ++i) {
        if (expected[i].is_floating_point()) {
          expected[i].lerp_(now[i], 1 - d);
        } else {
          expected[i] = now[i];
        }
      }
    }
    // The training's own weights and random draws (dropout) are those of a run that does not
    // average.
    CHECK(equal(weights(plain.model()), weights(averaging.model())));
    // A checkpoint carries the average, and load_model (inference) gives it.
    const ImageModel average = reloaded_average(averaging, dir);
    CHECK(equal(weights(average), expected));
    CHECK_FALSE(equal(weights(average), weights(averaging.model())));
    // Without averaging, load_model gives the trained weights.
    CHECK(equal(weights(reloaded_average(plain, dir)), weights(plain.model())));
  }
}

TEST_CASE("Train.WeightAverage.ResumeIsExact") {
  const TrainerOptions options = tiny("vit", 0.95);
  TempDir dir("weight-average-resume");
  Trainer whole(options), first(options);
  whole.set_total_steps(8);
  first.set_total_steps(8);
  for (std::uint64_t n = 0; n < 8; ++n) whole.step(batch(n));
  for (std::uint64_t n = 0; n < 3; ++n) first.step(batch(n));
  const std::string path = dir / "step-3.pt";
  write_file_atomically(path, first.checkpoint(true));
  const Checkpoint checkpoint = read_checkpoint(path);
  torch::manual_seed(777);
  Trainer resumed(options, nullptr, &checkpoint);
  for (std::uint64_t n = 3; n < 8; ++n) resumed.step(batch(n));
  CHECK(equal(weights(resumed.model()), weights(whole.model())));
  CHECK(equal(weights(reloaded_average(resumed, dir)), weights(reloaded_average(whole, dir))));

  // A checkpoint of a run that did not average: the average starts from its weights.
  Trainer plain(tiny("vit", 0));
  plain.set_total_steps(8);
  for (std::uint64_t n = 0; n < 3; ++n) plain.step(batch(n));
  write_file_atomically(path, plain.checkpoint(true));
  const Checkpoint unaveraged = read_checkpoint(path);
  Trainer started(options, nullptr, &unaveraged);
  CHECK(equal(weights(reloaded_average(started, dir)), weights(plain.model())));
}
