#include <doctest/doctest.h>
#include <torch/torch.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "graph/error.hpp"
#include "stages/train/partitioned/batch_runner.hpp"
#include "stages/train/step/train_step.hpp"
#include "stages/train/step/trainer.hpp"
#include "tests/train/relative_difference.hpp"
#include "tests/train/training_fixture.hpp"

using namespace flowtrain;
using namespace flowtrain::train;
using flowtrain::testing::relative_difference;

namespace {

using Kind = PartitionScheduleKind;

const ModelConfig kConfig{.image_size = 32,
                          .patch_size = 8,
                          .dim = 32,
                          .depth = 4,
                          .heads = 2,
                          .classes = 5,
                          .regression_outputs = 1};
constexpr int kBatch = 8;

ViT fresh_model() {
  torch::manual_seed(7);
  ViT model(kConfig);
  model->train();
  return model;
}

struct Data {
  torch::Tensor images, labels, energy;
};

Data batch(int n) {
  torch::manual_seed(100 + n);
  return {torch::randn({kBatch, 3, 32, 32}), torch::randint(0, 5, {kBatch}, torch::kLong),
          torch::randn({kBatch, 1})};
}

// The loss of some samples: cross-entropy of the labels plus the regression's MSE.
torch::Tensor loss_of(const ModelOutput& out, const Data& d, std::int64_t from, std::int64_t to) {
  return torch::nn::functional::cross_entropy(out.logits, d.labels.slice(0, from, to)) +
         torch::mse_loss(out.regression, d.energy.slice(0, from, to));
}

// One batch through the whole model at once: the reference.
void step_unsplit(ViT& model, const Data& d) {
  loss_of(model->forward(d.images), d, 0, kBatch).backward();
}

// One batch through `splits` under `schedule`, in micro-batches.
PartitionedBatchResult step_split(ViT& model,
                               const Data& d,
                               const PartitionSchedule& schedule,
                               const std::vector<int>& splits) {
  const std::int64_t size = kBatch / schedule.microbatches;
  const auto stages = vit_model_stages(model, splits, [&](const ModelOutput& out, int m) {
    return loss_of(out, d, m * size, (m + 1) * size);
  });
  return run_partitioned_batch(
      schedule, stages, [&](int m) { return d.images.slice(0, m * size, (m + 1) * size); }, 1);
}

const std::vector<std::tuple<Kind, int, std::vector<int>>> kLayouts = {
    {Kind::kGPipe, 1, {2}}, {Kind::k1F1B, 1, {2}}, {Kind::kInterleaved, 2, {1, 2, 3}}};

}  // namespace

// Micro-batches through the partitions give the unsplit model's gradients (the mean loss's:
// each micro-batch's scaled by 1/M), for every schedule; 1F1B keeps fewer activations.
TEST_CASE("Train.PipelineParallel.GradientsEqualTheUnsplitModels" * doctest::timeout(120)) {
  ViT reference = fresh_model();
  const Data d = batch(0);
  step_unsplit(reference, d);
  for (const auto& [kind, chunks, splits] : kLayouts) {
    const std::string schedule_name = to_string(kind);
    CAPTURE(schedule_name);
    ViT model = fresh_model();
    const PartitionSchedule schedule = make_partition_schedule(kind, 2, 4, chunks);
    const PartitionedBatchResult r = step_split(model, d, schedule, splits);
    CHECK(relative_difference(*model, *reference, true) < 1e-5);
    CHECK(r.losses.size() == 4);
    CHECK(r.spans[0].size() == static_cast<std::size_t>(2 * 4 * chunks));
    CHECK(r.bubble >= 0);
    CHECK(r.bubble < 1);
    if (kind == Kind::kGPipe) CHECK(r.peak_in_flight == std::vector<int>{4, 4});
    if (kind == Kind::k1F1B) CHECK(r.peak_in_flight == std::vector<int>{2, 1});
  }
}

// And after several optimizer steps (one per batch), the same weights. SGD: AdamW divides each
// gradient by its own running magnitude, so a parameter whose gradient is near zero moves by
// about the learning rate whatever the sign of its last bits, which no split can keep.
TEST_CASE("Train.PipelineParallel.WeightsAfterStepsEqualTheUnsplitModels" * doctest::timeout(120)) {
  for (const auto& [kind, chunks, splits] : kLayouts) {
    const std::string schedule_name = to_string(kind);
    CAPTURE(schedule_name);
    ViT reference = fresh_model(), model = fresh_model();
    torch::optim::SGD ref_opt(reference->parameters(), torch::optim::SGDOptions(0.1));
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
    const PartitionSchedule schedule = make_partition_schedule(kind, 2, 4, chunks);
    for (int n = 0; n < 4; ++n) {
      const Data d = batch(n);
      ref_opt.zero_grad();
      step_unsplit(reference, d);
      ref_opt.step();
      opt.zero_grad();
      step_split(model, d, schedule, splits);
      opt.step();
    }
    CHECK(relative_difference(*model, *reference) < 1e-5);
  }
}

// The memory each partition's thread held at once follows the micro-batches it kept: GPipe's
// first partition keeps all 8 micro-batches' activations until its backwards, 1F1B's at most 2.
// Measured on the second batch (the first also makes the gradients, kept from then on).
TEST_CASE("Train.PipelineParallel.PeakMemoryFollowsTheMicrobatchesKept" * doctest::timeout(120)) {
  std::vector<std::int64_t> peaks;
  for (const Kind kind : {Kind::kGPipe, Kind::k1F1B}) {
    ViT model = fresh_model();
    const PartitionSchedule schedule = make_partition_schedule(kind, 2, 8);
    torch::manual_seed(3);
    const torch::Tensor images = torch::randn({64, 3, 32, 32});
    const torch::Tensor labels = torch::randint(0, 5, {64}, torch::kLong);
    const auto stages = vit_model_stages(model, {2}, [&](const ModelOutput& out, int m) {
      return torch::nn::functional::cross_entropy(out.logits, labels.slice(0, 8 * m, 8 * m + 8));
    });
    PartitionedBatchResult r;
    for (int n = 0; n < 2; ++n) {
      model->zero_grad();
      r = run_partitioned_batch(schedule, stages,
                             [&](int m) { return images.slice(0, 8 * m, 8 * m + 8); }, 1);
    }
    REQUIRE(r.peak_bytes.size() == 2);
    MESSAGE(std::string(to_string(kind)) << ": partitions held " << r.peak_bytes[0] << " and "
                            << r.peak_bytes[1] << " bytes at most");
    CHECK(r.peak_bytes[0] > 0);
    CHECK(r.peak_bytes[1] > 0);
    peaks.push_back(r.peak_bytes[0]);
  }
  CHECK(peaks[0] > 2 * peaks[1]);
}

namespace {
// Two pipeline ranks of one test process, talking through memory as through c10d: a receive
// makes a new tensor, in the receiving rank's thread.
class Loopback final : public PartitionTransport {
 public:
  struct Wire {
    std::mutex mutex;
    std::condition_variable arrived;
    std::map<std::pair<int, int>, torch::Tensor> sent;  // (to, tag)
  };
  Loopback(Wire& wire, int rank) : wire_(wire), rank_(rank) {}
  int rank() const override { return rank_; }
  void send(int to, int tag, const torch::Tensor& tensor, const std::string&) override {
    std::lock_guard lock(wire_.mutex);
    wire_.sent[{to, tag}] = tensor;
    wire_.arrived.notify_all();
  }
  torch::Tensor recv(int, int tag, const std::string&) override {
    std::unique_lock lock(wire_.mutex);
    wire_.arrived.wait(lock, [&] { return wire_.sent.count({rank_, tag}) != 0; });
    const torch::Tensor sent = wire_.sent[{rank_, tag}];
    wire_.sent.erase({rank_, tag});
    return sent.clone();
  }
  void flush() override {}

 private:
  Wire& wire_;
  int rank_;
};
}  // namespace

// A rank of a job counts the activations it receives and keeps for its backward: with GPipe
// the last rank keeps all 8 micro-batches' inputs, which in one process the partition before it
// made (and is charged with).
TEST_CASE("Train.PipelineParallel.ARankCountsTheActivationsItReceives" * doctest::timeout(120)) {
  const PartitionSchedule schedule = make_partition_schedule(Kind::kGPipe, 2, 8);
  torch::manual_seed(3);
  const torch::Tensor images = torch::randn({64, 3, 32, 32});
  const torch::Tensor labels = torch::randint(0, 5, {64}, torch::kLong);
  const auto run = [&](bool ranks) {
    ViT model = fresh_model();
    const auto stages = vit_model_stages(model, {2}, [&](const ModelOutput& out, int m) {
      return torch::nn::functional::cross_entropy(out.logits, labels.slice(0, 8 * m, 8 * m + 8));
    });
    const auto input = [&](int m) { return images.slice(0, 8 * m, 8 * m + 8); };
    std::vector<std::int64_t> peaks(2);
    for (int step = 0; step < 2; ++step) {  // the second step: the gradients exist already
      model->zero_grad();
      if (!ranks) {
        peaks = run_partitioned_batch(schedule, stages, input, 1).peak_bytes;
        continue;
      }
      Loopback::Wire wire;
      Loopback first(wire, 0), second(wire, 1);
      std::thread other([&] {
        peaks[1] = run_partitioned_batch(schedule, stages, input, 1, {}, &second).peak_bytes[1];
      });
      peaks[0] = run_partitioned_batch(schedule, stages, input, 1, {}, &first).peak_bytes[0];
      other.join();
    }
    return peaks;
  };
  const std::vector<std::int64_t> process = run(false), job = run(true);
  const std::int64_t inputs = 8 * 8 * 17 * 32 * 4;  // 8 micro-batches of 8 x 17 tokens x 32
  MESSAGE("the last partition held " << process[1] << " bytes in one process, " << job[1]
                                     << " on its rank; its inputs are " << inputs);
  CHECK(job[1] - process[1] >= inputs * 9 / 10);
}

// A stage that fails stops every rank (none waits forever for its tensor) and is named.
TEST_CASE("Train.PipelineParallel.AStageErrorNamesRankStageAndMicrobatch" * doctest::timeout(60)) {
  ViT model = fresh_model();
  const Data d = batch(0);
  std::vector<ModelStageFn> stages = vit_model_stages(
      model, {2}, [&](const ModelOutput& out, int m) { return loss_of(out, d, 2 * m, 2 * m + 2); });
  const ModelStageFn second = stages[1];
  stages[1] = [second](const torch::Tensor& x, int m) {
    if (m == 2) throw Error("out of memory, say");
    return second(x, m);
  };
  for (const Kind kind : {Kind::kGPipe, Kind::k1F1B}) {
    CHECK_THROWS_WITH_AS(
        run_partitioned_batch(make_partition_schedule(kind, 2, 4), stages,
                           [&](int m) { return d.images.slice(0, 2 * m, 2 * m + 2); }),
        "pipeline rank 1, forward of stage 1, micro-batch 2: out of memory, say", Error);
  }
  CHECK_THROWS_WITH_AS(vit_model_stages(model, {2, 2}, nullptr),
                       "pipeline split points must rise within 1 .. 3 (the model has 4 blocks), "
                       "got 2 after 2",
                       Error);
  CHECK(balanced_splits(12, 3) == std::vector<int>{4, 8});
  CHECK(balanced_splits(4, 2) == std::vector<int>{2});
}

// train_step's pipeline keys, as a config gives them.
TEST_CASE("Train.PipelineParallel.StepOptionsChecked") {
  PartitionStepOptions o{.partitions = 2,
                         .microbatches = 8,
                         .partition_schedule = PartitionScheduleKind::kInterleaved,
                         .chunks_per_partition = 2,
                         .partition_splits = {2, 4, 6}};
  const PartitionOptions p = o.config(3);
  CHECK(p.partitions == 2);
  CHECK(p.threads == 3);  // each partition's, as a node or a rank
  CHECK(p.schedule == PartitionScheduleKind::kInterleaved);
  CHECK(p.splits == std::vector<int>{2, 4, 6});

  o.partition_schedule = PartitionScheduleKind::k1F1B;
  CHECK_THROWS_WITH(o.config(2),
                    "param 'chunks_per_partition' (2) needs partition_schedule: interleaved");
  o.chunks_per_partition = 1;
  o.partition_splits = {2.5};
  CHECK_THROWS_WITH(o.config(2),
                    "param 'partition_splits' must hold block indices (whole numbers >= 1)");
}

TEST_CASE("Train.PipelineParallel.MeasuredSplitsGiveTheSmallestLargestStage") {
  // [embedding, blocks..., heads]: the embedding counts with the first block, the heads with
  // the last.
  CHECK(measured_splits({0.5, 1, 1, 1, 1, 2.5}, 2) == std::vector<int>{3});
  CHECK(measured_splits({0, 1, 1, 1, 1, 0}, 2) == balanced_splits(4, 2));
  CHECK(measured_splits({0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0}, 3) == balanced_splits(12, 3));
  CHECK(measured_splits({0, 4, 1, 1, 1, 1, 0}, 2) == std::vector<int>{1});
  CHECK(measured_splits({0, 1, 2, 3, 4, 5, 6, 0}, 3) == std::vector<int>{3, 5});  // 6 | 9 | 6
  // Equal choices: the earliest splits. 10 then 1s: every 2-way split has 10 as its largest.
  CHECK(measured_splits({10, 0, 1, 1, 1, 0}, 2) == std::vector<int>{1});
  CHECK(measured_splits({0, 1, 1, 0}, 1).empty());
  CHECK_THROWS_WITH(measured_splits({0, 1, 1, 0}, 3),
                    "cannot split a model of 2 blocks into 3 pipeline stages");
}

TEST_CASE("Train.PipelineParallel.MeasuredBalanceFollowsAnExpensiveHead" * doctest::timeout(120)) {
  // 80,000 classes on a narrow ViT: the heads cost far more than a block, so the measured
  // balance gives the last partition one block where counting gives it two.
  TrainerOptions options;
  options.model = ModelConfig{.image_size = 16, .patch_size = 8, .dim = 32, .depth = 4,
                              .heads = 2, .classes = 80000};
  options.loss.alpha = 1;
  options.seed = 4;
  ViT vit(options.model);
  const torch::Tensor probe = torch::randn({8, 3, 16, 16});
  const std::vector<double> costs = piece_seconds(*vit, probe, /*backward=*/true);
  REQUIRE(costs.size() == 6);
  for (const double c : costs) CHECK(c > 0);
  CHECK(costs.back() > 2 * costs[1]);
  CHECK(measured_splits(costs, 2) == std::vector<int>{3});

  // Through the Trainer: the split it measured is in its state, and a checkpoint keeps it.
  torch::manual_seed(11);
  data::Batch b;
  b.labels = torch::randint(0, 80000, {8}, torch::kLong);
  b.images = torch::randn({8, 3, 16, 16});
  b.end_position = 8;
  TrainerOptions piped = options;
  piped.partitioned = {.partitions = 2, .measured_balance = true, .microbatches = 2};
  Trainer trainer(piped), reference(options);
  CHECK(trainer.state().pipeline_splits == std::vector<int>{3});
  trainer.step(b);
  reference.step(b);
  // Where the model is split does not change the math: the gradients are the same within float32
  // rounding. (Its weights are not compared: no total_steps, so this step's lr is min_lr.)
  CHECK(relative_difference(*trainer.model(), *reference.model(), /*gradients=*/true) < 1e-5);
  testing::TempDir dir("measured-splits");
  write_file_atomically(dir / "step.pt", trainer.checkpoint(true));
  CHECK(read_checkpoint(dir / "step.pt").state.pipeline_splits == std::vector<int>{3});

  // Resumed, it splits where its checkpoint says (each rank's optimizer state follows the
  // split), not where it would measure.
  TrainerOptions given = piped;
  given.partitioned.measured_balance = false;
  given.partitioned.splits = {2};
  Trainer at_two(given);
  at_two.step(b);
  write_file_atomically(dir / "step.pt", at_two.checkpoint(true));
  const Checkpoint checkpoint = read_checkpoint(dir / "step.pt");
  Trainer resumed(piped, nullptr, &checkpoint);
  CHECK(resumed.state().pipeline_splits == std::vector<int>{2});

  // Both ways of saying where to split: refused.
  PartitionStepOptions both{.partitions = 2, .partition_splits = {2}};
  both.partition_balance = PartitionBalance::kMeasured;
  CHECK_THROWS_WITH(both.config(2), doctest::Contains("give one of them"));
}
