// The Trainer alone, with no graph around it: what a training step computes, and exact resume
// from checkpoint bytes.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <limits>

#include <oneapi/tbb/task_arena.h>
#include <oneapi/tbb/task_group.h>

#include "graph/error.hpp"
#include "stages/train/step/trainer.hpp"
#include "tests/train/fixed_task.hpp"
#include "tests/train/relative_difference.hpp"
#include "tests/train/training_fixture.hpp"

using namespace flowtrain;
using namespace flowtrain::train;
using flowtrain::testing::relative_difference;
using flowtrain::testing::TempDir;

namespace {

TrainerOptions tiny(std::uint64_t seed) {
  TrainerOptions options;
  options.model = ModelConfig{.image_size = 16, .patch_size = 8, .dim = 16, .depth = 1, .heads = 2,
                            .classes = 3};
  options.seed = seed;
  options.optimizer.lr = 1e-2;
  options.loss.alpha = 1;  // labels only: no teacher needed
  return options;
}

data::Batch batch(std::uint64_t number) { return testing::fixed_task_batch(number); }

// Steps `from` to `to` (exclusive), each on its own batch, built before the step so the
// trainer's random draws are its own.
void run_steps(Trainer& trainer, std::uint64_t from, std::uint64_t to) {
  for (std::uint64_t n = from; n < to; ++n) {
    const data::Batch b = batch(n);
    trainer.step(b);
  }
}

bool same_weights(Trainer& a, Trainer& b) {
  const auto pa = a.model()->parameters();
  const auto pb = b.model()->parameters();
  if (pa.size() != pb.size()) return false;
  for (std::size_t i = 0; i < pa.size(); ++i) {
    if (!torch::equal(pa[i], pb[i])) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("Train.Trainer.LearnsAFixedTask") {
  Trainer trainer(tiny(1));
  trainer.set_total_steps(60);
  double first = 0, last = 0;
  for (std::uint64_t n = 0; n < 60; ++n) {
    const data::Batch b = batch(n % 4);
    const StepOutcome out = trainer.step(b);
    REQUIRE(out.applied);
    CHECK(out.seen == 8);
    (n < 4 ? first : last) += n < 4 || n >= 56 ? out.loss / 4 : 0;
  }
  CHECK(trainer.state().step == 60);
  CHECK(trainer.state().data_position == 4 * 8);
  CHECK(last < first * 0.5);
}

TEST_CASE("Train.Trainer.SameSeedSameWeightsOtherSeedOthers") {
  Trainer a(tiny(7)), b(tiny(7)), c(tiny(8));
  for (Trainer* t : {&a, &b, &c}) {
    t->set_total_steps(5);
    run_steps(*t, 0, 5);
  }
  CHECK(same_weights(a, b));
  CHECK_FALSE(same_weights(a, c));
}

// Bytes taken after step 3, written and read back, continue to the same weights as a trainer
// that never stopped: the optimizer state, the schedule and the RNG (dropout) travel with them.
TEST_CASE("Train.Trainer.ResumeFromCheckpointBytesIsExact") {
  TrainerOptions options = tiny(3);
  options.model.dropout = 0.1;
  TempDir dir("trainer");
  Trainer whole(options), first(options);
  whole.set_total_steps(8);
  first.set_total_steps(8);
  run_steps(whole, 0, 8);
  run_steps(first, 0, 3);
  const std::string path = dir / "step-3.pt";
  write_file_atomically(path, first.checkpoint(true));
  const Checkpoint checkpoint = read_checkpoint(path);
  CHECK(checkpoint.state.step == 3);
  CHECK(checkpoint.state.total_steps == 8);
  CHECK(checkpoint.state.data_position == 3 * 8);

  torch::manual_seed(12345);  // whatever the process did since: the checkpoint's RNG counts
  Trainer resumed(options, nullptr, &checkpoint);
  CHECK(resumed.resumed());
  run_steps(resumed, 3, 8);
  CHECK(resumed.state().step == 8);
  CHECK(same_weights(whole, resumed));
  CHECK_FALSE(same_weights(whole, first));
}

TEST_CASE("Train.Trainer.NonFiniteLossStopsOrSkips") {
  data::Batch bad = batch(0);
  bad.images[0][0][0][0] = std::numeric_limits<float>::quiet_NaN();
  Trainer strict(tiny(1));
  CHECK_THROWS_WITH_AS(strict.step(bad), doctest::Contains("step 1 (batch 0): loss is nan"),
                       Error);

  TrainerOptions options = tiny(1);
  options.skip_nonfinite = true;
  Trainer lenient(options);
  const StepOutcome out = lenient.step(bad);
  CHECK_FALSE(out.applied);
  CHECK(lenient.state().step == 0);
  CHECK(lenient.state().skipped_steps == 1);
  CHECK(lenient.step(batch(1)).applied);
  CHECK(lenient.state().step == 1);
}

TEST_CASE("Train.Trainer.DistillationNeedsTeacherOutputs") {
  TrainerOptions options = tiny(1);
  options.loss.alpha = 0.5;
  Trainer trainer(options);
  CHECK_THROWS_WITH_AS(trainer.step(batch(0)), doctest::Contains("has no teacher outputs"), Error);
  data::Batch b = batch(0);
  b.teacher_logits = torch::randn({8, 3});
  CHECK(trainer.step(b).applied);
}


// partitions / microbatches in a train_step's config: the Trainer runs each batch through
// the pipeline and ends where the unpartitioned Trainer does, distillation loss included. The
// first step's gradients agree within float32 rounding (the micro-batches sum in another
// order; 3e-7 measured). The weights after three AdamW steps agree less closely: the first
// update of each weight is about lr * sign(gradient), so a rounding difference in a gradient
// near zero moves that weight by up to lr (1.2e-4 measured on a Zen 4, against moves of 1e-2).
TEST_CASE("Train.Trainer.PipelineEndsWhereTheUnpartitionedModelDoes" * doctest::timeout(120)) {
  TrainerOptions options = tiny(3);
  options.model.depth = 4;
  options.loss.alpha = 0.5;
  options.loss.temperature = 2;
  const auto with_teacher = [](std::uint64_t n) {
    data::Batch b = batch(n);
    b.teacher_logits = torch::randn({8, 3});
    return b;
  };
  Trainer reference(options), first(options);  // three steps, and the first alone
  reference.set_total_steps(3);  // the schedule's lr (past its end: min_lr)
  first.set_total_steps(3);
  std::vector<data::Batch> batches;
  for (std::uint64_t n = 0; n < 3; ++n) batches.push_back(with_teacher(n));
  for (const data::Batch& b : batches) reference.step(b);
  first.step(batches[0]);

  struct Case {
    const char* name;
    PartitionOptions pipeline;
  };
  using Kind = PartitionScheduleKind;
  const std::vector<Case> cases = {
      {"gpipe 2 x 4", {.partitions = 2, .microbatches = 4, .schedule = Kind::kGPipe}},
      {"1f1b 2 x 4", {.partitions = 2, .microbatches = 4, .schedule = Kind::k1F1B}},
      {"interleaved 2 x 2 x 4",
       {.partitions = 2, .chunks_per_partition = 2, .microbatches = 4, .schedule = Kind::kInterleaved}},
      {"1f1b 2 x 3, uneven micro-batches, split [1]",
       {.partitions = 2, .splits = {1}, .microbatches = 3, .schedule = Kind::k1F1B}},
      {"micro-batches alone (1 x 3)", {.partitions = 1, .microbatches = 3}},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    TrainerOptions piped = options;
    piped.partitioned = c.pipeline;
    Trainer trainer(piped);
    trainer.set_total_steps(3);
    REQUIRE(trainer.partitioned());
    StepOutcome last = trainer.step(batches[0]);
    CHECK(relative_difference(*trainer.model(), *first.model(), /*gradients=*/true) < 1e-5);
    for (std::size_t n = 1; n < batches.size(); ++n) last = trainer.step(batches[n]);
    CHECK(last.applied);
    CHECK(last.seen == 8);
    CHECK(relative_difference(*trainer.model(), *reference.model()) < 1e-3);
    CHECK(trainer.state().step == 3);
    if (c.pipeline.partitions > 1) {
      CHECK(last.bubble > 0);
      CHECK(last.bubble < 1);
    }
    CHECK(last.peak_in_flight >= 1);
  }
}

TEST_CASE("Train.Trainer.PipelineRefusesWhatItCannotSplitExactly") {
  TrainerOptions options = tiny(3);
  options.model.depth = 4;
  options.partitioned = {.partitions = 2, .microbatches = 2};
  TrainerOptions dropout = options;
  dropout.model.dropout = 0.1;
  CHECK_THROWS_WITH(Trainer{dropout}, doctest::Contains("needs dropout: 0 and drop_path: 0"));
  TrainerOptions splits = options;
  splits.partitioned.splits = {1, 2};
  CHECK_THROWS_WITH(Trainer{splits},
                    "2 split points make 3 model chunks, but 2 partitions x 1 chunks per "
                    "partition need 2");
  TrainerOptions resnet = options;
  resnet.model = model_config("resnet18", 32, 3);
  CHECK_THROWS_WITH(Trainer{resnet},
                    doctest::Contains("pipeline parallelism splits a ViT between its blocks"));
  Trainer trainer(options);
  data::Batch one = batch(0);
  one.images = one.images.narrow(0, 0, 1);
  one.labels = one.labels.narrow(0, 0, 1);
  CHECK_THROWS_WITH(trainer.step(one), "batch 0 has 1 samples, fewer than microbatches (2)");
}

// The partitions as a graph runs them (train_partition nodes): each in a oneTBB task of its
// own, a partition waiting for another's tensor suspending its task. They end where the
// partitions on threads of their own (Trainer::step) do, bit for bit, for every schedule: each
// partition's actions run in the schedule's order on the same intra-op threads. With one
// thread in the arena the partitions take turns on it, which only works if a waiting one
// lets go of the thread.
TEST_CASE("Train.Trainer.PartitionsAsTasksEndWhereThreadsDo" * doctest::timeout(120)) {
  TrainerOptions options = tiny(5);
  options.model.depth = 4;
  using Kind = PartitionScheduleKind;
  const std::vector<PartitionOptions> layouts = {
      {.partitions = 2, .microbatches = 4, .schedule = Kind::kGPipe},
      {.partitions = 2, .microbatches = 4, .schedule = Kind::k1F1B},
      {.partitions = 2, .chunks_per_partition = 2, .microbatches = 4, .schedule = Kind::kInterleaved},
      {.partitions = 3, .microbatches = 3, .schedule = Kind::k1F1B}};
  for (const PartitionOptions& layout : layouts) {
    CAPTURE(to_string(layout.schedule));
    CAPTURE(layout.partitions);
    options.partitioned = layout;
    Trainer threads(options);
    for (std::uint64_t n = 0; n < 3; ++n) threads.step(batch(n));
    for (const int arena_threads : {1, 2}) {
      CAPTURE(arena_threads);
      Trainer tasks(options);
      tbb::task_arena arena(arena_threads);
      StepOutcome last;
      for (std::uint64_t n = 0; n < 3; ++n) {
        const data::Batch b = batch(n);
        std::size_t buckets = 0;
        arena.execute([&] {
          tasks.begin_partitions(b);
          tbb::task_group others;
          for (int p = 1; p < layout.partitions; ++p)
            others.run([&tasks, p] { tasks.partitioned()->run_partition(p); });
          tasks.partitioned()->run_partition(0);
          others.wait();
          buckets = tasks.end_partitions();
        });
        CHECK(buckets == 1);
        tasks.sync_bucket(0);
        last = tasks.apply();
      }
      CHECK(last.applied);
      // Every forward and backward of the last step, on its partition's track.
      CHECK(last.timeline.size() ==
            static_cast<std::size_t>(2 * layout.partitions * layout.chunks_per_partition *
                                     layout.microbatches));
      CHECK(same_weights(tasks, threads));
      CHECK(tasks.state().step == 3);
      CHECK(tasks.partitioned()->wait_seconds(layout.partitions - 1) >
            0);  // it waited for partition 0
    }
  }
}

// A run failing elsewhere (Stage::cancel) lets a partition waiting for another's tensor go:
// it returns, and the step ends with the reason, instead of waiting for a partition whose task
// will never start.
TEST_CASE("Train.Trainer.CancelledPartitionsStopWaiting" * doctest::timeout(60)) {
  TrainerOptions options = tiny(5);
  options.model.depth = 4;
  options.partitioned = {.partitions = 2, .microbatches = 4};
  Trainer trainer(options);
  tbb::task_arena arena(1);
  const data::Batch b = batch(0);
  arena.execute([&] {
    trainer.begin_partitions(b);
    tbb::task_group canceller;
    // Runs once partition 1 has suspended (it needs partition 0's first activation).
    canceller.run([&] { trainer.partitioned()->cancel("the run failed in another stage"); });
    trainer.partitioned()->run_partition(1);  // returns: cancelled
    canceller.wait();
    trainer.partitioned()->run_partition(
        0);  // returns at its first backward, which waits: cancelled
    CHECK_THROWS_WITH_AS(trainer.end_partitions(), "the run failed in another stage", Error);
  });
  // Later steps of a cancelled run are refused the same way.
  arena.execute([&] {
    trainer.begin_partitions(b);
    trainer.partitioned()->run_partition(1);
    trainer.partitioned()->run_partition(0);
    CHECK_THROWS_WITH_AS(trainer.end_partitions(), "the run failed in another stage", Error);
  });
}
