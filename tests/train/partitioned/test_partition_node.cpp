// A training step's model partitions as nodes of one process's graph: `train_step` with
// `partitions` brings `<name>/partition1` .. (train_partition), which work on each step at the
// same time as the entry, a partition waiting for another's tensor letting go of its thread.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "graph/config.hpp"
#include "graph/error.hpp"
#include "graph/report.hpp"
#include "tests/stage_result.hpp"
#include "tests/train/cli_runs.hpp"
#include "tests/train/training_fixture.hpp"

using namespace flowtrain;
using namespace flowtrain::testing;
namespace fs = std::filesystem;

namespace {

// 320 images (10 steps of 32) through a ViT of 4 blocks in `partitions` partitions on
// `threads` graph threads, checkpoints in `dir`.
std::string config(const std::string& images,
                   int threads,
                   int partitions,
                   const std::string& dir,
                   const std::string& more = "") {
  std::string data = data_stages("train", 1, true);
  const std::string synthetic = synthetic_images() + "/train";
  data.replace(data.find(synthetic), synthetic.size(), images);
  return "threads: " + std::to_string(threads) + "\ncores: " + std::to_string(threads) +
         "\nstages:\n" + data +
         "  - {type: train_step, name: student, queue_capacity: 2, params: {classes: 4, "
         "image_size: 32, patch_size: 8, dim: 48, depth: 4, heads: 3, alpha: 1, lr: 0.002, "
         "warmup_steps: 2, intraop_threads: 1, microbatches: 4, partitions: " +
         std::to_string(partitions) + ", checkpoint_dir: " + dir + more + "}}\n";
}

std::vector<StageConfig> nodes_of(const std::string& yaml) {
  return expanded_stages(parse_pipeline_config(yaml, "nodes.yaml"));
}

}  // namespace

// The entry runs partition 0 and brings a node for each other partition, in a chain before
// grad_sync, each on the entry's intraop_threads. They work at once, so a phase with fewer
// graph threads than partitions is refused by name when its config is checked.
TEST_CASE("Train.PartitionNodes.EntryBringsANodePerPartition") {
  TempDir dir;
  const std::string train = synthetic_images() + "/train";
  const std::vector<StageConfig> nodes = nodes_of(config(train, 3, 3, dir / "run"));
  std::vector<std::string> names;
  for (const StageConfig& s : nodes) names.push_back(s.name);
  CHECK(names == std::vector<std::string>{"source", "jpeg_decode", "augment", "collate", "student",
                                          "student/partition1", "student/partition2",
                                          "student/grad_sync", "student/optimizer_step",
                                          "student/step_log", "student/checkpoint"});
  CHECK(nodes[5].type == "train_partition");
  CHECK(nodes[5].options.inputs == std::vector<std::string>{"student"});
  CHECK(nodes[6].options.inputs == std::vector<std::string>{"student/partition1"});
  CHECK(nodes[7].options.inputs == std::vector<std::string>{"student/partition2"});
  CHECK(nodes[6].params.get_int("partition") == 2);
  CHECK(nodes[6].params.get_int("intraop_threads") == 1);
  CHECK(nodes[4].options.token_from == "student/optimizer_step");

  // One partition: no nodes.
  CHECK(nodes_of(config(train, 1, 1, dir / "run"))[5].name == "student/grad_sync");

  const PipelineConfig two = parse_pipeline_config(config(train, 2, 2, dir / "run"), "two.yaml");
  check_thread_budget(two);
  const PipelineConfig one = parse_pipeline_config(config(train, 1, 2, dir / "run"), "one.yaml");
  CHECK_THROWS_WITH_AS(check_thread_budget(one),
                       doctest::Contains("the nodes 'student', 'student/partition1' work on "
                                         "each item at the same time, but the phase has 1 graph "
                                         "thread: give it threads: 2 or more"),
                       Error);
}

// The partitions' nodes train to the same weights whatever the graph's threads (the decode
// and augment workers then run in other orders, and in the partitions' waits). The report has
// a row per partition, each partition's wait for the others (its share of the bubble) and the
// step's pipeline chart.
TEST_CASE("Train.PartitionNodes.SameWeightsWhateverTheGraphThreads" * doctest::timeout(300)) {
  TempDir dir;
  const std::string train = synthetic_images() + "/train";
  const RunReport two = run_config(config(train, 2, 2, dir / "two"));
  const RunReport three = run_config(config(train, 3, 2, dir / "three"));
  CHECK(max_weight_difference(dir / "two/final.pt", dir / "three/final.pt") == 0);
  CHECK(result(two, "student", "steps") == 10);
  CHECK(result(two, "student", "pipeline_bubble") > 0);
  const double waited = result(two, "student/partition1", "waited_ms");
  MESSAGE("partition 1 waited " << waited << " ms a step for partition 0");
  CHECK(waited > 0);
  for (const StageReport& s : two.stages) {
    if (s.name != "student/partition1") continue;
    CHECK(s.items_in == 10);
    CHECK(s.waiting.seconds > 0);
    CHECK(s.waiting.param == "microbatches");
    CHECK_FALSE(s.waiting.held_after);
  }
  const std::string report = format_report(two);
  CHECK(report.find("'student' timeline of item 10") != std::string::npos);
  CHECK(report.find("\n  partition 1  ") != std::string::npos);
}

// A stage that fails while the partitions work on a step ends the run with its error: a
// partition waiting for a tensor of a partition whose task the failing run will not start is
// let go (Stage::cancel), so the run never hangs.
TEST_CASE("Train.PartitionNodes.AFailingStageEndsTheRun" * doctest::timeout(300)) {
  TempDir dir;
  const fs::path images = dir / "train";
  fs::copy(synthetic_images() + "/train", images, fs::copy_options::recursive);
  std::vector<fs::path> files;
  for (const auto& e : fs::recursive_directory_iterator(images)) {
    if (e.is_regular_file()) files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  const fs::path broken = files[files.size() / 2];
  std::ofstream(broken, std::ios::trunc) << "not a JPEG";
  std::string yaml = config(images.string(), 2, 2, dir / "run");
  yaml.replace(yaml.find("{type: jpeg_decode, concurrency: 2}"),
               std::string("{type: jpeg_decode, concurrency: 2}").size(),
               "{type: jpeg_decode, concurrency: 2, params: {on_bad_sample: fail}}");
  CHECK_THROWS_WITH_AS(run_config(yaml),
                       doctest::Contains("stage 'jpeg_decode' failed on item"), StageError);
}
