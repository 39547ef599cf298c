// A teacher split into pipeline partitions (teacher_infer's `partitions`): graph nodes that
// each run a chunk of its blocks, and together give the whole teacher's outputs bit for bit.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <filesystem>
#include <string>
#include <vector>

#include "graph/config.hpp"
#include "graph/error.hpp"
#include "graph/pipeline.hpp"
#include "stages/train/files/checkpoint.hpp"
#include "stages/train/files/torchscript.hpp"
#include "stages/train/inference/inference_model.hpp"
#include "stages/train/inference/teacher_infer.hpp"
#include "stages/train/models/resnet.hpp"
#include "stages/train/models/vit.hpp"
#include "tests/train/training_fixture.hpp"

using namespace flowtrain;
using namespace flowtrain::train;
using namespace flowtrain::testing;
namespace fs = std::filesystem;

namespace {

ModelConfig partitioned_vit() {
  return ModelConfig{.image_size = 32,
                     .patch_size = 8,
                     .dim = 32,
                     .depth = 4,
                     .heads = 2,
                     .classes = 4,
                     .regression_outputs = 1,
                     .distillation_token = true};
}

ModelConfig partitioned_resnet() {
  return ModelConfig{.arch = "resnet",
                     .image_size = 32,
                     .dim = 8,
                     .classes = 4,
                     .regression_outputs = 1,
                     .stage_blocks = {2, 2}};
}

// A model of `config`, initialised from seed 1, saved as a checkpoint at `path`.
void save_teacher(const std::string& path, const ModelConfig& config) {
  torch::manual_seed(1);
  save_checkpoint(path, make_model(config), nullptr, {});
}

// The outputs of the model in `path` run as a chain of partitions split at `splits`, each
// loaded on its own and keeping only its chunk's weights, as partition nodes do.
ModelOutput chained(const std::string& path,
                    InferenceModel::Precision precision,
                    const torch::Tensor& images,
                    std::vector<int> splits) {
  torch::Tensor x = images;
  InferenceModel::PartitionOutput part;
  splits.insert(splits.begin(), 0);
  for (std::size_t i = 0; i < splits.size(); ++i) {
    const std::unique_ptr<InferenceModel> model = InferenceModel::load(path, precision);
    const int end = i + 1 < splits.size() ? splits[i + 1] : model->blocks();
    model->keep_only(splits[i], end);
    part = model->forward_partition(x, splits[i], end);
    x = part.activation;
    CHECK(x.defined() == (i + 1 < splits.size()));
  }
  return part.outputs;
}

}  // namespace

TEST_CASE("Train.TeacherPartitions.ChainGivesTheWholeForwardBitForBit" * doctest::timeout(120)) {
  TempDir dir;
  torch::manual_seed(3);
  const torch::Tensor images = torch::rand({6, 3, 32, 32});
  for (const ModelConfig& config : {partitioned_vit(), partitioned_resnet()}) {
    const std::string path = dir / (config.arch + ".pt");
    save_teacher(path, config);
    for (const auto precision :
         {InferenceModel::Precision::kFloat32, InferenceModel::Precision::kBFloat16}) {
      const std::unique_ptr<InferenceModel> model = InferenceModel::load(path, precision);
      CAPTURE(model->description());
      REQUIRE(model->blocks() == 4);
      const ModelOutput whole = model->forward(images);
      for (const std::vector<int>& splits :
           {std::vector<int>{1}, std::vector<int>{2}, std::vector<int>{1, 3}}) {
        CAPTURE(splits.size());
        const ModelOutput parts = chained(path, precision, images, splits);
        CHECK(torch::equal(parts.logits, whole.logits));
        CHECK(torch::equal(parts.regression, whole.regression));
      }
      // A model that kept blocks [1, 3) runs them alike, and no longer has the embedding,
      // block 3 or the heads.
      const torch::Tensor first = model->forward_partition(images, 0, 1).activation;
      const torch::Tensor middle = model->forward_partition(first, 1, 3).activation;
      model->keep_only(1, 3);
      CHECK(torch::equal(model->forward_partition(first, 1, 3).activation, middle));
      CHECK_THROWS(model->forward_partition(images, 0, 1));
      CHECK_THROWS(model->forward_partition(middle, 3, 4));
    }
  }
  // A TorchScript module cannot be split, and says so.
  torch::manual_seed(1);
  export_torchscript(make_model(partitioned_vit()), dir / "scripted.pt");
  const std::unique_ptr<InferenceModel> scripted = InferenceModel::load(dir / "scripted.pt");
  CHECK(scripted->blocks() == 0);
  CHECK_THROWS_WITH_AS(scripted->forward_partition(images, 0, 1),
                       "TorchScript module cannot be split into pipeline partitions (a "
                       "flowtrain checkpoint can)",
                       Error);
}

// The same distillation with the teacher whole and in 3 partition nodes: the same student,
// bit for bit; each node reports its blocks and the activation it hands on.
TEST_CASE("Train.TeacherPartitions.NodesDistillAsTheWholeTeacherDoes" * doctest::timeout(300)) {
  TempDir dir;
  ModelConfig teacher = partitioned_vit();
  teacher.regression_outputs = 0;
  teacher.distillation_token = false;
  save_teacher(dir / "teacher.pt", teacher);
  const auto config = [&](const std::string& partitions, const std::string& out) {
    return "threads: 2\nstages:\n" + data_stages("train", 2, true) +
           "  - {type: teacher_infer, name: teacher, queue_capacity: 2, params: {model: " +
           (dir / "teacher.pt") + ", intraop_threads: 1" + partitions + "}}\n" +
           "  - {type: student_step, queue_capacity: 2, params: {classes: 4, image_size: 32, "
           "patch_size: 8, dim: 32, depth: 1, heads: 2, alpha: 0.3, lr: 0.003, "
           "intraop_threads: 1, checkpoint_dir: " +
           (dir / out) + "}}\n";
  };
  const std::string split = config(", partitions: 3, partition_splits: [1, 3]", "split");
  std::vector<std::string> names;
  for (const StageConfig& s : expanded_stages(parse_pipeline_config(split, "split.yaml"))) {
    names.push_back(s.name + " <- " + (s.options.inputs.empty() ? "" : s.options.inputs[0]));
  }
  CHECK(names == std::vector<std::string>{
                     "source <- ", "jpeg_decode <- ", "augment <- ", "collate <- ", "teacher <- ",
                     "teacher/partition1 <- teacher", "teacher/partition2 <- teacher/partition1",
                     "student_step <- ", "student_step/grad_sync <- student_step",
                     "student_step/optimizer_step <- student_step/grad_sync",
                     "student_step/step_log <- student_step/optimizer_step",
                     "student_step/checkpoint <- student_step/optimizer_step"});

  const RunReport whole = run_config(config("", "whole"));
  const RunReport parts = run_config(split);
  CHECK(result(parts, "student_step", "steps") == result(whole, "student_step", "steps"));
  const double images = result(whole, "teacher", "images");
  for (const char* node : {"teacher", "teacher/partition1", "teacher/partition2"}) {
    CHECK(result(parts, node, "images") == images);
  }
  CHECK(result(parts, "teacher", "first_block") == 0);
  CHECK(result(parts, "teacher", "blocks") == 1);
  CHECK(result(parts, "teacher/partition1", "first_block") == 1);
  CHECK(result(parts, "teacher/partition1", "blocks") == 2);
  CHECK(result(parts, "teacher/partition2", "blocks") == 1);
  // Each node holds its chunk's weights only: together, the whole teacher's.
  const double weights =
      static_cast<double>(InferenceModel::load(dir / "teacher.pt")->weight_bytes()) / 1e6;
  CHECK(result(parts, "teacher", "weights_mb") < 0.5 * weights);
  CHECK(result(parts, "teacher", "weights_mb") + result(parts, "teacher/partition1", "weights_mb") +
            result(parts, "teacher/partition2", "weights_mb") ==
        doctest::Approx(weights));
  // The tokens handed on: a batch of 32 images x 17 tokens x 32 floats.
  CHECK(result(parts, "teacher", "activation_mb") == doctest::Approx(32 * 17 * 32 * 4 / 1e6));

  const ImageModel a = load_model(read_checkpoint(dir / "whole/final.pt"));
  const ImageModel b = load_model(read_checkpoint(dir / "split/final.pt"));
  const auto pb = b->named_parameters();
  for (const auto& item : a->named_parameters()) {
    CAPTURE(item.key());
    CHECK(torch::equal(item.value(), pb[item.key()]));
  }
}

TEST_CASE("Train.TeacherPartitions.ProblemsAreNamed" * doctest::timeout(120)) {
  TempDir dir;
  save_teacher(dir / "teacher.pt", partitioned_vit());
  export_torchscript(make_model(partitioned_vit()), dir / "scripted.pt");
  const auto made = [&](const std::string& model, int partitions, std::vector<double> splits) {
    return std::make_unique<TeacherInferStage>(
        TeacherInferOptions{.inference = {.model = dir / model},
                            .partitions = partitions,
                            .partition_splits = std::move(splits)});
  };
  CHECK_THROWS_WITH_AS(made("teacher.pt", 2, {1, 2}),
                       "param 'partition_splits' gives 3 chunks for 2 partitions", Error);
  CHECK_THROWS_WITH_AS(made("teacher.pt", 1, {2}), "param 'partition_splits' needs partitions > 1",
                       Error);
  CHECK_THROWS_WITH_AS(made("teacher.pt", 5, {}),
                       "cannot split a model of 4 blocks into 5 pipeline stages", Error);
  CHECK_THROWS_WITH_AS(
      TeacherPartitionStage({.teacher = {.inference = {.model = dir / "teacher.pt"}}}),
      "param 'partition' (1) must be below partitions (1)", Error);
  CHECK_THROWS_WITH_AS(made("scripted.pt", 2, {}),
                       doctest::Contains("scripted.pt is a TorchScript module, which cannot be "
                                         "split (a flowtrain checkpoint can)"),
                       Error);
}

// `partition_balance: measured` times each piece's forward: a head of 50,000 classes costs
// more than several blocks, so the split moves from [2] to [3], in every node alike, and the
// outputs stay the whole teacher's.
TEST_CASE("Train.TeacherPartitions.MeasuredBalanceFollowsAnExpensiveHead" * doctest::timeout(120)) {
  TempDir dir;
  ModelConfig config = partitioned_vit();
  config.classes = 50000;
  config.distillation_token = false;
  save_teacher(dir / "teacher.pt", config);
  const TeacherInferOptions options{.inference = {.model = dir / "teacher.pt"},
                                    .partitions = 2,
                                    .partition_balance = PartitionBalance::kMeasured};
  Pipeline p;
  p.add("batches", [n = 0]() mutable -> std::optional<data::Batch> {
    if (n == 3) return std::nullopt;
    data::Batch batch;
    batch.number = static_cast<std::uint64_t>(n++);
    batch.images = torch::rand({8, 3, 32, 32});
    return batch;
  });
  p.add<TeacherInferStage>("teacher", options);
  p.add<TeacherPartitionStage>("teacher/partition1", {options, 1});
  std::vector<data::Batch> seen;
  p.add("sink", [&](data::Batch batch) { seen.push_back(std::move(batch)); });
  const RunReport report = p.run({.threads = 2});
  CHECK(result(report, "teacher", "blocks") == 3);
  CHECK(result(report, "teacher/partition1", "first_block") == 3);
  CHECK(result(report, "teacher/partition1", "blocks") == 1);
  const std::unique_ptr<InferenceModel> whole = InferenceModel::load(dir / "teacher.pt");
  REQUIRE(seen.size() == 3);
  for (const data::Batch& batch : seen) {
    CHECK(torch::equal(batch.teacher_logits, whole->forward(batch.images).logits));
  }
  CHECK_THROWS_WITH_AS(TeacherInferStage({.inference = {.model = dir / "teacher.pt"},
                                          .partitions = 2,
                                          .partition_splits = {1},
                                          .partition_balance = PartitionBalance::kMeasured}),
                       "params 'partition_splits' and 'partition_balance: measured' both say "
                       "where to split: give one of them",
                       Error);
}
