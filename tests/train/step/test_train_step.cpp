#include <doctest/doctest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>

#include "graph/autotune.hpp"
#include "graph/csv.hpp"
#include "graph/error.hpp"
#include "graph/registry.hpp"
#include "stages/data/batch.hpp"
#include "stages/train/files/checkpoint.hpp"
#include "stages/train/inference/teacher_cache.hpp"
#include "stages/train/models/compute.hpp"
#include "stages/train/models/vit.hpp"
#include "stages/train/step/optimizer.hpp"
#include "stages/train/step/step_times.hpp"
#include "stages/train/step/train_step.hpp"
#include "tests/train/training_fixture.hpp"

using namespace flowtrain;
using namespace flowtrain::train;
using namespace flowtrain::testing;
namespace fs = std::filesystem;

namespace {

// A small ViT on 32 px inputs: 16 patches of 8 px.
std::string tiny_vit(int dim, int depth, int heads) {
  return "classes: 4, image_size: 32, patch_size: 8, dim: " + std::to_string(dim) +
         ", depth: " + std::to_string(depth) + ", heads: " + std::to_string(heads);
}

// A randomly initialised teacher (seed 1) for the 32 px, 4-class data, saved as a checkpoint.
void write_tiny_teacher(const std::string& path) {
  torch::manual_seed(1);
  ViT teacher(ModelConfig{.image_size = 32, .patch_size = 8, .dim = 32, .depth = 1, .heads = 2,
                        .classes = 4});
  save_checkpoint(path, teacher, nullptr, {});
}

std::string evaluate_config(const std::string& model) {
  return "threads: 2\nstages:\n" + data_stages("val", 1, false) +
         "  - {type: evaluate, params: {model: " + model + "}}\n";
}

}  // namespace

TEST_CASE("Train.Distill.TeacherLearnsStudentFollows" * doctest::timeout(300)) {
  TempDir runs;
  const RunReport teacher = run_config(
      "threads: 2\nstages:\n" + data_stages("train", 6, true) +
      "  - {type: student_step, name: teacher, queue_capacity: 2, params: {" + tiny_vit(64, 2, 4) +
      ", alpha: 1, lr: 0.003, warmup_steps: 5, intraop_threads: 1, checkpoint_dir: " +
      (runs / "teacher") + "}}\n");
  CHECK(result(teacher, "teacher", "steps") == 60);  // 6 epochs x 10 batches
  REQUIRE(fs::exists(runs / "teacher/final.pt"));

  const double teacher_top1 =
      result(run_config(evaluate_config(runs / "teacher/final.pt")), "evaluate", "top1");
  CHECK(teacher_top1 >= 0.9);

  const RunReport student = run_config(
      "threads: 2\nstages:\n" + data_stages("train", 6, true) +
      "  - {type: teacher_infer, queue_capacity: 2, params: {model: " + (runs / "teacher/final.pt") +
      "}}\n"
      "  - {type: student_step, queue_capacity: 2, params: {" + tiny_vit(32, 1, 2) +
      ", alpha: 0.3, temperature: 2, lr: 0.003, warmup_steps: 5, checkpoint_dir: " +
      (runs / "student") + "}}\n");
  CHECK(result(student, "student_step", "steps") == 60);
  const double student_top1 =
      result(run_config(evaluate_config(runs / "student/final.pt")), "evaluate", "top1");
  MESSAGE("teacher top-1 " << teacher_top1 << ", student top-1 " << student_top1);
  CHECK(student_top1 >= teacher_top1 - 0.1);
}

namespace {

struct PoisonBatchOptions {
  std::int64_t batch = 3;
  template <class Declare>
  void declare(Declare& d) {
    d(batch, "batch", "batch number to poison");
  }
};

// Test-only: fills the images of one batch with NaN, the way a corrupt input would poison a step.
class PoisonBatchStage final : public Map<data::Batch, data::Batch> {
 public:
  using Options = PoisonBatchOptions;
  explicit PoisonBatchStage(const Options& options) : number_(options.batch) {}
  static StageDoc describe() { return {"test: NaN images in one batch", option_specs<Options>()}; }

 protected:
  std::optional<data::Batch> process(data::Batch&& batch, ItemContext&) override {
    if (static_cast<std::int64_t>(batch.number) == number_) {
      batch.images = torch::full_like(batch.images, NAN);
    }
    return std::move(batch);
  }

 private:
  std::int64_t number_;
};
FLOWTRAIN_REGISTER_STAGE("test_poison_batch", PoisonBatchStage);

std::string poisoned_config(const std::string& on_nonfinite) {
  return "threads: 2\nstages:\n" + data_stages("train", 1, true) +
         "  - {type: test_poison_batch, params: {batch: 3}}\n"
         "  - {type: student_step, params: {" +
         tiny_vit(32, 1, 2) + ", alpha: 1, on_nonfinite: " + on_nonfinite + "}}\n";
}

}  // namespace

TEST_CASE("Train.NonFinite.FailNamesTheStep" * doctest::timeout(120)) {
  std::string message;
  try {
    run_config(poisoned_config("fail"));
  } catch (const StageError& e) {
    message = e.what();
  }
  // Found where the update would be made, after the gradient was averaged (with several ranks
  // every one of them skips or stops alike).
  CHECK(message.find("'student_step/optimizer_step'") != std::string::npos);
  CHECK(message.find("step 4 (batch 3): loss is nan") != std::string::npos);
}

TEST_CASE("Train.NonFinite.SkipCountsAndContinues" * doctest::timeout(120)) {
  const RunReport report = run_config(poisoned_config("skip"));
  CHECK(result(report, "student_step", "skipped_nonfinite") == 1);
  CHECK(result(report, "student_step", "steps") == 9);  // 10 batches, one skipped
  CHECK(std::isfinite(result(report, "student_step", "loss")));
}

TEST_CASE("Train.Supervised.AlphaBelowOneNeedsTeacher" * doctest::timeout(120)) {
  CHECK_THROWS_WITH_AS(
      run_config("threads: 2\nstages:\n" + data_stages("train", 1, true) +
                 "  - {type: student_step, params: {" + tiny_vit(32, 1, 2) + ", alpha: 0.5}}\n"),
      doctest::Contains("no teacher outputs: put a teacher_infer stage before"), StageError);
}

// The step of batch t+1 starts after the update of batch t ends, in batch order, while two
// teacher workers run ahead and finish out of order.
TEST_CASE("Train.TokenLoop.UpdatesStrictlyOrdered" * doctest::timeout(180)) {
  TempDir dir;
  write_tiny_teacher(dir / "teacher.pt");

  const PipelineConfig config = parse_pipeline_config(
      "threads: 2\nstages:\n" + data_stages("train", 2, true) +
          "  - {type: teacher_infer, concurrency: 2, queue_capacity: 4, params: {model: " +
          (dir / "teacher.pt") + "}}\n  - {type: student_step, queue_capacity: 4, params: {" +
          tiny_vit(32, 1, 2) + "}}\n",
      "token_loop.yaml");
  Pipeline pipeline;
  TrainStepStage* student = nullptr;
  for (const StageConfig& stage : expanded_stages(config)) {
    std::unique_ptr<Stage> built = Registry::global().find(stage.type)->make(stage.params, BuildContext{});
    if (stage.type == "student_step") student = static_cast<TrainStepStage*>(built.get());
    pipeline.add(stage.name, std::move(built), stage.options);
  }
  const RunReport report = pipeline.run(config.run);
  REQUIRE(student != nullptr);
  const auto& history = student->history();
  REQUIRE(history.size() == 20);
  for (std::size_t t = 0; t < history.size(); ++t) {
    CHECK(history[t].step == t + 1);
    CHECK(history[t].batch_number == t);
    if (t > 0) CHECK(history[t].begin_s >= history[t - 1].time_s);
  }
  CHECK(report.stages[4].name == "teacher_infer");
  CHECK(report.stages[4].workers == 2);
}

TEST_CASE("Train.StudentStep.SerialOnly") {
  CHECK_THROWS_WITH_AS(
      parse_pipeline_config("stages:\n" + data_stages("train", 1, true) +
                                "  - {type: student_step, concurrency: 2, params: {classes: 4}}\n",
                            "serial.yaml"),
      doctest::Contains("concurrency 2 is not allowed"), Error);
}

TEST_CASE("Train.ThreadBudget.IntraOpCountsAgainstCores") {
  TempDir dir;
  write_tiny_teacher(dir / "teacher.pt");
  const std::string stages = data_stages("train", 1, true) +
                             "  - {type: teacher_infer, params: {intraop_threads: 2, model: " +
                             (dir / "teacher.pt") +
                             "}}\n  - {type: student_step, params: {intraop_threads: 2, " +
                             tiny_vit(32, 1, 2) + "}}\n";
  // Two graph threads could run teacher and student together: 4 threads on 2 cores. Refused
  // from the config, before anything is built.
  CHECK_THROWS_WITH_AS(
      check_thread_budget(parse_pipeline_config("threads: 2\ncores: 2\nstages:\n" + stages, "t.yaml")),
                       doctest::Contains("thread budget: up to 4 threads could run at once (2 "
                                         "graph threads, 'teacher_infer' 2 intra-op threads, "
                                         "'student_step' 2 intra-op threads, "
                                         "'student_step/optimizer_step' 2 intra-op threads), "
                                         "more than the 2 "
                                         "cores granted; lower threads or a stage's "
                                         "intraop_threads, or raise cores"),
                       Error);
  // One graph thread: they take turns on both cores.
  const RunReport report = run_config("threads: 1\ncores: 2\nstages:\n" + stages);
  CHECK(report.peak_threads == 2);
  CHECK(report.layout().find("'teacher_infer' 1 x 2 intra-op threads") != std::string::npos);
}

// bf16 autocast in the teacher and the student: the run completes with finite losses, and the
// student's numbers differ from a float32 run (so autocast really took effect).
TEST_CASE("Train.Autocast.Bf16Runs" * doctest::timeout(120)) {
  TempDir dir;
  write_tiny_teacher(dir / "teacher.pt");
  const auto run = [&](const std::string& autocast) {
    return run_config("threads: 2\nstages:\n" + data_stages("train", 1, true) +
                      "  - {type: teacher_infer, params: {autocast: " + autocast +
                      ", model: " + (dir / "teacher.pt") +
                      "}}\n  - {type: student_step, params: {autocast: " + autocast + ", " +
                      tiny_vit(32, 1, 2) + "}}\n");
  };
  const double bf16 = result(run("bf16"), "student_step", "loss");
  const double fp32 = result(run("none"), "student_step", "loss");
  CHECK(std::isfinite(bf16));
  CHECK(bf16 != fp32);
  CHECK(bf16 == doctest::Approx(fp32).epsilon(0.05));
}

// autocast: auto is bf16 exactly where the kernel lists a bf16 dot-product instruction (an
// independent reading of the CPU), and a run with it is the run with its resolution, bit for bit,
// teacher cache keys included.
TEST_CASE("Train.Autocast.AutoIsBf16WhereTheCpuHasBf16Instructions" * doctest::timeout(120)) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  bool listed = false;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream flags(line.substr(line.find(':') + 1));
    for (std::string flag; flags >> flag;) listed |= flag == "avx512_bf16" || flag == "amx_bf16";
    break;
  }
  CHECK(cpu_has_bf16() == listed);
  const std::string resolved = listed ? "bf16" : "none";
  CHECK(resolve_autocast("auto") == resolved);
  for (const std::string word : {"none", "bf16", "fp16"}) CHECK(resolve_autocast(word) == word);

  TempDir dir;
  write_tiny_teacher(dir / "teacher.pt");
  CHECK(teacher_fingerprint(dir / "teacher.pt", "auto") ==
        teacher_fingerprint(dir / "teacher.pt", resolved));
  const auto loss = [&](const std::string& autocast) {
    return result(run_config("threads: 2\nstages:\n" + data_stages("train", 1, true) +
                                 "  - {type: teacher_infer, params: {autocast: " + autocast +
                                 ", model: " + (dir / "teacher.pt") +
                                 "}}\n  - {type: student_step, params: {autocast: " + autocast +
                                 ", " + tiny_vit(32, 1, 2) + "}}\n"),
                  "student_step", "loss");
  };
  CHECK(loss("auto") == loss(resolved));
}

// A regression head trained on a numeric target from a CSV manifest: evaluate reports its mean
// absolute error, which training brings well below that of predicting nothing.
TEST_CASE("Train.Regression.TargetLearnedAndMaeReported" * doctest::timeout(180)) {
  TempDir dir;
  // The synthetic training images with a numeric target: the label itself (as an energy per
  // food group would be, once normalised).
  std::ofstream csv(dir / "train.csv");
  csv << "path,label,energy\n";
  for (int label = 0; label < 4; ++label) {
    const std::string folder = synthetic_images() + "/train/class_0" + std::to_string(label);
    for (const auto& entry : fs::directory_iterator(folder)) {
      csv << entry.path().string() << "," << label << "," << label << "\n";
    }
  }
  csv.close();
  const std::string data =
      "  - {type: csv_manifest, name: source, params: {manifest: " + (dir / "train.csv") +
      ", epochs: EPOCHS, seed: 3}}\n"
      "  - {type: jpeg_decode, concurrency: 2}\n"
      "  - {type: augment, concurrency: 2, params: {size: 32, mode: eval, eval_crop: 1.0}}\n"
      "  - {type: collate, params: {batch_size: 32, pool_size: 8}}\n";
  const auto with_epochs = [&](int epochs) {
    std::string text = data;
    text.replace(text.find("EPOCHS"), 6, std::to_string(epochs));
    return text;
  };
  const RunReport trained = run_config(
      "threads: 2\nstages:\n" + with_epochs(8) + "  - {type: student_step, params: {" +
      tiny_vit(48, 2, 3) +
      ", regression_outputs: 1, regression_weight: 1, alpha: 1, lr: 0.003, warmup_steps: 5, "
      "checkpoint_dir: " + (dir / "run") + "}}\n");
  CHECK(result(trained, "student_step", "steps") == 80);
  const RunReport evaluated = run_config("threads: 2\nstages:\n" + with_epochs(1) +
                                         "  - {type: evaluate, params: {model: " +
                                         (dir / "run/final.pt") + "}}\n");
  const double mae = result(evaluated, "evaluate", "mae");
  MESSAGE("regression MAE " << mae << " (targets 0, 1, 2, 3)");
  CHECK(mae < 0.4);  // predicting the mean (1.5) would give 1
  const double top1 = result(evaluated, "evaluate", "top1");
  CHECK(top1 >= 0.9);

  // The class medians of the manifest's targets are the labels themselves: answering them for
  // the predicted class errs by 1 to 3 on each wrong prediction and by nothing on a right one.
  const RunReport by_class = run_config(
      "threads: 2\nstages:\n" + with_epochs(1) + "  - {type: evaluate, params: {model: " +
      (dir / "run/final.pt") + ", class_targets_from: " + (dir / "train.csv") +
      ", predictions: " + (dir / "out/predictions.csv") + "}}\n");
  const double mae_by_class = result(by_class, "evaluate", "mae_by_class");
  MESSAGE("MAE of the predicted class's median " << mae_by_class << ", top-1 " << top1);
  CHECK(result(by_class, "evaluate", "mae") == mae);  // the head's is unchanged

  // Each image's prediction, in the manifest's order though the source shuffled them: the
  // counts and errors above, photo by photo.
  const std::vector<CsvRow> manifest = read_csv_file(dir / "train.csv");
  const auto check_predictions = [&](const std::string& path, double top1_reported,
                                     std::optional<double> mae_reported) {
    const std::vector<CsvRow> rows = read_csv_file(path);
    REQUIRE(rows.size() == manifest.size());
    std::vector<std::string> header = {"index", "path", "label", "predicted", "probability",
                                       "target_0"};
    if (mae_reported) header.push_back("output_0");
    CHECK(rows[0].fields == header);
    double right = 0, abs_error = 0;
    for (std::size_t i = 1; i < rows.size(); ++i) {
      const std::vector<std::string>& f = rows[i].fields;
      REQUIRE(f.size() == header.size());
      CHECK(f[0] == std::to_string(i - 1));
      CHECK(f[1] == manifest[i].fields[0]);
      CHECK(f[2] == manifest[i].fields[1]);
      CHECK(std::stod(f[4]) >= 0.25);  // the most probable of 4 classes
      CHECK(std::stod(f[4]) <= 1);
      CHECK(std::stod(f[5]) == std::stod(manifest[i].fields[2]));
      right += f[2] == f[3];
      if (mae_reported) abs_error += std::abs(std::stod(f[5]) - std::stod(f[6]));
    }
    const double n = static_cast<double>(rows.size() - 1);
    CHECK(right / n == doctest::Approx(top1_reported));
    if (mae_reported) CHECK(abs_error / n == doctest::Approx(*mae_reported).epsilon(1e-4));
  };
  check_predictions(dir / "out/predictions.csv", top1, mae);
  CHECK(mae_by_class >= (1 - top1) - 1e-9);
  CHECK(mae_by_class <= 3 * (1 - top1) + 1e-9);
  // The same through an untrained model (no regression head), which errs on most images: the
  // bounds hold for its predictions, not its labels.
  write_tiny_teacher(dir / "random.pt");
  const RunReport random = run_config(
      "threads: 2\nstages:\n" + with_epochs(1) + "  - {type: evaluate, params: {model: " +
      (dir / "random.pt") + ", class_targets_from: " + (dir / "train.csv") +
      ", predictions: " + (dir / "random.csv") + "}}\n");
  const double random_top1 = result(random, "evaluate", "top1");
  check_predictions(dir / "random.csv", random_top1, std::nullopt);
  const double random_mae = result(random, "evaluate", "mae_by_class");
  MESSAGE("untrained: MAE of the predicted class's median " << random_mae << ", top-1 "
                                                            << random_top1);
  CHECK(random_top1 < 0.6);
  CHECK(random_mae >= (1 - random_top1) - 1e-9);
  CHECK(random_mae <= 3 * (1 - random_top1) + 1e-9);
  CHECK_THROWS_WITH_AS(
      run_config("threads: 2\nstages:\n" + with_epochs(1) +
                 "  - {type: evaluate, params: {model: " + (dir / "run/final.pt") +
                 ", class_targets_from: " + synthetic_images() + "/train/class_00}}\n"),
      doctest::Contains("param 'class_targets_from': "), Error);
}

namespace {
std::vector<std::string> node_names(const std::string& yaml) {
  std::vector<std::string> names;
  for (const StageConfig& s : expanded_stages(parse_pipeline_config(yaml, "nodes.yaml"))) {
    names.push_back(s.name);
  }
  return names;
}
}  // namespace

// A regression head of 2^31 - 1 outputs was an allocation until killed; the config refuses it.
TEST_CASE("Train.TrainStep.RegressionOutputsHaveASaneRange") {
  CHECK_THROWS_WITH_AS(
      parse_pipeline_config("stages:\n" + data_stages("train", 1, true) +
                                "  - {type: train_step, params: {" + tiny_vit(32, 1, 2) +
                                ", regression_outputs: 2147483647}}\n",
                            "big.yaml"),
      doctest::Contains("param 'regression_outputs' must be <= 65536, got 2147483647"), Error);
}

// Renamed params load under their former names, in a config and in an override, as the new
// ones do; an override under one name wins over the config's other, and a config giving both
// names of one param is refused.
TEST_CASE("Config.FormerNames.PartitionScheduleAndChunksPerPartition") {
  const std::string head = "stages:\n" + data_stages("train", 1, true) +
                           "  - {type: train_step, params: {" + tiny_vit(32, 1, 2) +
                           ", partitions: 2, microbatches: 2, ";
  auto params = [&](const std::string& keys, const std::vector<std::string>& overrides = {}) {
    return parse_pipeline_config(head + keys + "}}\n", "names.yaml", overrides).stages.back().params;
  };
  const Params renamed = params("partition_schedule: interleaved, chunks_per_partition: 2");
  const Params former = params("pipeline_schedule: interleaved, virtual_stages: 2");
  CHECK(renamed.get_string("partition_schedule") == "interleaved");
  CHECK(renamed.get_int("chunks_per_partition") == 2);
  CHECK((former.values() == renamed.values()));
  CHECK((params("partition_schedule: gpipe, virtual_stages: 1",
                {"stages.train_step.params.pipeline_schedule=interleaved",
                 "stages.train_step.params.chunks_per_partition=2"})
             .values() == renamed.values()));
  CHECK_THROWS_WITH_AS(params("virtual_stages: 2, chunks_per_partition: 2"),
                       doctest::Contains("param 'chunks_per_partition' is given twice, also under "
                                         "its former name 'virtual_stages'; keep one of them"),
                       Error);
  const ParamSpec* spec = Registry::global().find("train_step")->find_param("pipeline_schedule");
  REQUIRE(spec != nullptr);
  CHECK(spec->name == "partition_schedule");
}

// One train_step entry brings the nodes that write its files, named after it; with no folder
// only the step log; an entry that takes the step's output itself turns the expansion off.
TEST_CASE("Train.TrainStep.EntryBringsItsWriterNodes") {
  TempDir dir;
  const std::string head = "stages:\n" + data_stages("train", 1, true);
  const std::string params = tiny_vit(32, 1, 2) + ", checkpoint_dir: " + (dir / "run");
  const std::vector<std::string> data = {"source", "jpeg_decode", "augment", "collate"};
  auto with = [&](std::vector<std::string> rest) {
    std::vector<std::string> all = data;
    all.insert(all.end(), rest.begin(), rest.end());
    return all;
  };
  CHECK(node_names(head + "  - {type: train_step, name: student, params: {" + params +
                   ", snapshot_every: 5}}\n") ==
        with({"student", "student/grad_sync", "student/optimizer_step", "student/step_log",
              "student/checkpoint", "student/snapshot"}));
  CHECK(node_names(head + "  - {type: student_step, params: {" + tiny_vit(32, 1, 2) + "}}\n") ==
        with({"student_step", "student_step/grad_sync", "student_step/optimizer_step",
              "student_step/step_log"}));
  // An entry that takes the step's records turns the writers off, not the step's own nodes;
  // it takes them from optimizer_step, which the entry's name stands for.
  const std::string own_writer = head + "  - {type: train_step, params: {" + params + "}}\n" +
                                 "  - {type: checkpoint, params: {dir: " + (dir / "mine") +
                                 ", keep: 1}}\n";
  CHECK(node_names(own_writer) ==
        with({"train_step", "train_step/grad_sync", "train_step/optimizer_step", "checkpoint"}));
  const PipelineConfig config = parse_pipeline_config(own_writer, "own_writer.yaml");
  const std::vector<StageConfig> nodes = expanded_stages(config);
  CHECK(nodes[4].options.token_from == "train_step/optimizer_step");
  CHECK(nodes.back().options.inputs.empty());  // after optimizer_step: takes its records
  const std::string named = head + "  - {type: train_step, name: student, params: {" + params +
                            "}}\n  - {type: checkpoint, inputs: [student], params: {dir: " +
                            (dir / "mine") + "}}\n";
  CHECK(expanded_stages(parse_pipeline_config(named, "named.yaml")).back().options.inputs ==
        std::vector<std::string>{"student/optimizer_step"});
}

// The writers get the records: steps.csv has a row per step, the checkpoint node the files.
TEST_CASE("Train.TrainStep.WritersWriteStepsAndCheckpoints" * doctest::timeout(120)) {
  TempDir dir;
  const RunReport report = run_config(
      "threads: 2\nstages:\n" + data_stages("train", 1, true) +
      "  - {type: train_step, params: {" + tiny_vit(32, 1, 2) +
      ", alpha: 1, checkpoint_every: 4, keep_checkpoints: 1, snapshot_every: 5, checkpoint_dir: " +
      (dir / "run") + "}}\n");
  CHECK(result(report, "train_step", "steps") == 10);
  // The step's times, typed, from the results it wrote: the node is the entry's own.
  const std::optional<StepTimes> times = step_times(report);
  REQUIRE(times);
  CHECK(times->stage->name == "train_step");
  CHECK(times->steps == 10);
  CHECK(times->images > 9 * 32);  // ten batches of 32, the last maybe short
  CHECK(times->images <= 10 * 32);
  CHECK(times->forward_ms > 0);
  CHECK(times->backward_ms > 0);
  CHECK(times->optimizer_ms > 0);
  CHECK(times->sync_wait_ms == 0);  // one rank
  CHECK(times->step_ms() >= times->forward_ms + times->backward_ms + times->optimizer_ms);
  CHECK_FALSE(step_times(report.stages.front()));                  // the source is no train_step
  CHECK(result(report, "train_step/checkpoint", "written") == 3);  // steps 4 and 8, final.pt
  CHECK(result(report, "train_step/snapshot", "written") == 2);    // steps 5 and 10
  CHECK(step_checkpoints(dir / "run") == std::vector<std::string>{dir / "run/step-00000008.pt"});
  CHECK(read_checkpoint(dir / "run/final.pt").state.step == 10);
  CHECK(std::filesystem::exists(dir / "run/snapshots/step-00000010.pt"));
  std::ifstream csv(dir / "run/steps.csv");
  std::string line;
  int rows = 0;
  while (std::getline(csv, line)) ++rows;
  CHECK(rows == 11);  // header + 10 steps
}

namespace {
// Distillation on 2 cores in a naive layout (one graph thread, every stage at concurrency 1 and
// 1 intra-op thread) for autotune to start from: `epochs` of the synthetic images, the tiny
// teacher written into `runs`, and the train_step entry `step` ("{type: train_step, ...}").
std::string naive_kd_config(const TempDir& runs,
                            int epochs,
                            const std::string& autotune,
                            const std::string& step) {
  return "threads: 1\ncores: 2\n" + autotune +
         "stages:\n"
         "  - {type: image_folder, name: source, params: {root: " + synthetic_images() +
         "/train, epochs: " + std::to_string(epochs) + ", seed: 3}}\n"
         "  - {type: jpeg_decode}\n"
         "  - {type: augment, params: {size: 32, scale: [0.6, 1.0]}}\n"
         "  - {type: collate, params: {batch_size: 32, pool_size: 8}}\n"
         "  - {type: teacher_infer, queue_capacity: 2, params: {model: " + (runs / "teacher.pt") +
         "}}\n  - " + step + "\n";
}

// Whether the models in two checkpoints hold the same weights, bit for bit.
bool same_weights(const std::string& a, const std::string& b) {
  const auto wa = load_model(read_checkpoint(a))->named_parameters();
  const auto wb = load_model(read_checkpoint(b))->named_parameters();
  if (wa.size() != wb.size()) return false;
  return std::all_of(wa.begin(), wa.end(),
                     [&](const auto& item) { return torch::equal(item.value(), wb[item.key()]); });
}
}  // namespace

// Autotune changes only what cannot change the results on any CPU (graph threads, stage
// concurrency, queues: each invocation's math stays on its own fixed intra-op threads), and its
// trials are the run's own steps: the tuned run's weights equal, bit for bit, those of the
// config as written and of the config with the chosen settings. It does not rely on any stage's
// sums staying the same across intra-op threads: on AMD family 26 (OpenBLAS's Haswell kernels)
// the teacher's products differ between 1 and 2 threads, which autotune used to tune mid-run.
TEST_CASE("Train.Autotune.WeightsEqualTheUntunedRunsBitForBit" * doctest::timeout(300)) {
  TempDir runs;
  write_tiny_teacher(runs / "teacher.pt");
  // Dropout on, so the random state matters too.
  const auto config = [&](const std::string& dir, const std::string& autotune) {
    return naive_kd_config(runs, 60, autotune,
                           "{type: train_step, queue_capacity: 2, params: {" + tiny_vit(32, 1, 2) +
                               ", dropout: 0.1, alpha: 0.5, temperature: 2, lr: 0.003, "
                               "warmup_steps: 5, checkpoint_dir: " + (runs / dir) + "}}");
  };
  const PipelineConfig tuned_config = parse_pipeline_config(
      config("tuned", "autotune: {warmup_s: 0.1, trial_s: 0.3, max_trials: 4}\n"), "tuned.yaml");
  REQUIRE(tuned_config.run.autotune.enabled);
  std::unique_ptr<Pipeline> pipeline = build_pipeline(tuned_config);
  const RunReport tuned = autotune_run(*pipeline, tuned_config.run, stage_decls(tuned_config));
  REQUIRE(tuned.autotune);
  const AutotuneReport& a = *tuned.autotune;
  MESSAGE(format_autotune(a));
  CHECK(a.trials.size() >= 2);           // it paused mid-run and tried another layout
  CHECK(a.tuning_items < 60 * 320);      // ... before the run's end
  CHECK(result(tuned, "train_step", "steps") == 600);  // 60 epochs x 10 batches, none lost

  run_config(config("plain", ""));
  const PipelineConfig chosen =
      parse_pipeline_config(config("chosen", ""), "chosen.yaml", a.overrides);
  build_pipeline(chosen)->run(chosen.run);

  for (const std::string other : {"plain", "chosen"}) {
    CAPTURE(other);
    CHECK(same_weights(runs / "tuned/final.pt", runs / (other + "/final.pt")));
  }
}

// The training step's own intra-op threads change its sums, so autotune times its counts on
// rehearsals (throwaway copies whose updates are never committed and which write nothing) and
// fixes one before the run is built, then tunes on with the run's own steps: the run's weights
// equal, bit for bit, those of the config with the chosen settings.
TEST_CASE("Train.Autotune.RehearsalsFixTheStepsThreadsAndWriteNothing" * doctest::timeout(300)) {
  TempDir runs;
  write_tiny_teacher(runs / "teacher.pt");
  const auto config = [&](const std::string& dir, const std::string& autotune) {
    return naive_kd_config(runs, 20, autotune,
                           "{type: train_step, name: student, queue_capacity: 2, params: {" +
                               tiny_vit(32, 1, 2) +
                               ", dropout: 0.1, alpha: 0.5, lr: 0.003, warmup_steps: 5, "
                               "checkpoint_every: 3, keep_checkpoints: 1, snapshot_every: 4, "
                               "checkpoint_dir: " + (runs / dir) + "}}");
  };
  PipelineConfig phase = parse_pipeline_config(
      config("tuned", "autotune: {warmup_s: 0.1, trial_s: 0.3, max_trials: 6}\n"), "tuned.yaml");
  const std::optional<AutotuneReport> rehearsed = autotune_rehearse(phase);
  REQUIRE(rehearsed);
  MESSAGE(format_autotune(*rehearsed));
  // Both counts that fit 2 cores were rehearsed, each with its own search.
  std::size_t ones = 0, twos = 0;
  for (const AutotuneTrial& t : rehearsed->trials) {
    CHECK(t.rehearsal);
    ones += t.change.find("'student' intra-op 1:") != std::string::npos ? 1 : 0;
    twos += t.change.find("'student' intra-op 2:") != std::string::npos ? 1 : 0;
  }
  CHECK(ones >= 1);
  CHECK(twos >= 1);
  CHECK(ones + twos == rehearsed->trials.size());
  CHECK(rehearsed->chosen() != nullptr);
  CHECK(rehearsed->rehearsal_s > 0);
  CHECK(!std::filesystem::exists(runs / "tuned"));  // no checkpoint, log, snapshot or lock
  const std::int64_t chosen_threads = phase.stages.back().params.get_int("intraop_threads");
  const std::string key = "stages.student.params.intraop_threads=";
  const bool changed = std::any_of(rehearsed->overrides.begin(), rehearsed->overrides.end(),
                                   [&](const std::string& o) { return o.rfind(key, 0) == 0; });
  CHECK(changed == (chosen_threads != 1));

  std::unique_ptr<Pipeline> pipeline = build_pipeline(phase);
  const RunReport tuned = autotune_run(*pipeline, phase.run, stage_decls(phase), rehearsed);
  REQUIRE(tuned.autotune);
  const AutotuneReport& a = *tuned.autotune;
  MESSAGE(format_autotune(a));
  // The rehearsals first, then any trials left of the 6 on the run's own work.
  REQUIRE(a.trials.size() >= rehearsed->trials.size());
  REQUIRE(a.trials.size() <= 6);
  for (std::size_t t = 0; t < a.trials.size(); ++t) {
    CHECK(a.trials[t].rehearsal == (t < rehearsed->trials.size()));
  }
  CHECK(result(tuned, "student", "steps") == 200);  // 20 epochs x 10 batches, none lost
  std::ifstream csv(runs / "tuned/steps.csv");
  std::string line;
  int rows = 0;
  while (std::getline(csv, line)) ++rows;
  CHECK(rows == 201);  // header + the run's 200 steps: none of the rehearsals'

  const PipelineConfig chosen =
      parse_pipeline_config(config("chosen", ""), "chosen.yaml", a.overrides);
  build_pipeline(chosen)->run(chosen.run);
  CHECK(same_weights(runs / "tuned/final.pt", runs / "chosen/final.pt"));
}

// Every check that can run before a run runs when the config is loaded, for every phase: a
// second phase's model, augmentation or optimizer values are refused by `flowtrain check` and
// before the first phase trains, naming the phase, the stage and the line.
TEST_CASE("Config.Check.EveryPhaseIsCheckedBeforeTheFirstRuns" * doctest::timeout(60)) {
  const std::string step =
      "{type: train_step, name: student, params: {" + tiny_vit(64, 1, 4) + ", lr: 0.003}}\n";
  std::string stages;  // the data stages, as a phase's list
  std::istringstream lines(data_stages("train", 1, true));
  for (std::string line; std::getline(lines, line);) stages += "    " + line + "\n";
  const std::string text = "phases:\n  - name: first\n    stages:\n" + stages + "      - " + step +
                           "  - name: second\n    stages:\n" + stages + "      - " + step;
  CHECK_NOTHROW(parse_run_config(text, "two.yaml"));
  const std::string student = "phases.second.stages.student.params.";
  const std::string augment = "phases.second.stages.augment.params.";
  const std::string collate = "phases.second.stages.collate.params.";
  const std::vector<std::pair<std::string, std::string>> refused = {
      {student + "heads=3", "dim 64 is not divisible by heads 3"},
      {student + "classes=0", "classes"},
      {student + "patch_size=7", "image_size 32"},
      {student + "dropout=2", "dropout"},
      {student + "lr=.nan", "param 'lr' must be a finite number, got nan"},
      {student + "resume=true", "resume need a checkpoint_dir"},
      {collate + "std=[0,0,0]", "param 'std' values must be > 0"},
      {collate + "std=[0.2,0.2]", "need 3 values"},
      {augment + "scale=[1,0.5]", "param 'scale' must be [min, max]"},
      {augment + "eval_crop=0", "eval_crop"},
  };
  for (const auto& [override, message] : refused) {
    CAPTURE(override);
    try {
      parse_run_config(text, "two.yaml", {override});
      FAIL("accepted");
    } catch (const Error& e) {
      const std::string what = e.what();
      CHECK(what.find(message) != std::string::npos);
      CHECK(what.find("phase 'second'") != std::string::npos);
      // Where: the override that set the refused value, else the entry's line.
      CHECK((what.rfind("two.yaml:", 0) == 0 || what.rfind("override '" + override + "'", 0) == 0));
    }
  }
}

// A checkpoint whose data position lies past the end of the data the resumed run was given
// (fewer epochs, or a smaller folder) is refused with the source's size, not as a source that
// cannot seek.
TEST_CASE("Train.Resume.PastTheEndOfTheDataSaysSo" * doctest::timeout(120)) {
  TempDir dir;
  const auto config = [&](int epochs) {
    return "threads: 2\nstages:\n" + data_stages("train", epochs, true) +
           "  - {type: train_step, params: {" + tiny_vit(32, 1, 2) +
           ", alpha: 1, checkpoint_every: 15, resume: true, checkpoint_dir: " + (dir / "run") +
           "}}\n";
  };
  const PipelineConfig longer = parse_pipeline_config(config(2), "longer.yaml");
  build_pipeline(longer)->run(longer.run);
  REQUIRE(fs::exists(dir / "run/step-00000015.pt"));
  fs::remove(dir / "run/final.pt");  // resume from step 15: 480 images into the data
  const PipelineConfig shorter = parse_pipeline_config(config(1), "shorter.yaml");
  CHECK_THROWS_WITH_AS(
      build_pipeline(shorter)->run(shorter.run),
      doctest::Contains("resumes from source position 480, but source 'source' has only 320 "
                        "items: the checkpoint is from a run over more data"),
      Error);
}

// Pipeline partitions on ranks keep their own parameters' optimizer state: a job of them
// resumes on its own number of ranks only, and another is refused before anything runs.
TEST_CASE("Train.Resume.PipelineRanksOnAnotherNumberOfRanksIsRefused" * doctest::timeout(120)) {
  TempDir dir;
  const PipelineConfig config = parse_pipeline_config(
      "threads: 2\nstages:\n" + data_stages("train", 1, true) +
          "  - {type: train_step, params: {" + tiny_vit(32, 1, 2) +
          ", alpha: 1, checkpoint_every: 5, resume: true, checkpoint_dir: " + (dir / "run") +
          "}}\n",
      "job.yaml");
  build_pipeline(config)->run(config.run);
  // Step 5 as 2 pipeline ranks would have written it.
  Checkpoint step = read_checkpoint(dir / "run/step-00000005.pt");
  step.state.world_size = 2;
  step.state.partition_ranks = 2;
  step.state.zero_shards = 2;
  for (const int rank : {0, 1}) {
    save_checkpoint(rank_file(dir / "run/step-00000005.pt", rank), load_model(step), nullptr,
                    step.state);
  }
  for (const std::string name : {"final.pt", "step-00000010.pt"}) {
    REQUIRE(fs::remove(dir / ("run/" + name)));
  }
  CHECK_THROWS_WITH_AS(build_pipeline(config),
                       doctest::Contains("step-00000005.pt was written by 2 rank(s) as pipeline "
                                         "partitions; pipeline partitions resume with the same "
                                         "number of ranks and partitions settings"),
                       Error);
}
