// Pipeline parallelism across processes: `flowtrain run --nproc 2` with a model split into two
// partitions, one per rank, exchanging activations and gradients over c10d send/recv.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "stages/train/files/checkpoint.hpp"
#include "tests/train/cli_runs.hpp"
#include "tests/train/training_fixture.hpp"

using namespace flowtrain;
using namespace flowtrain::testing;
namespace fs = std::filesystem;

namespace {

// 320 images, 10 steps of 32, through a ViT of 4 blocks split in two (or not).
std::string write_config(const TempDir& dir) {
  const std::string path = dir / "pp.yaml";
  std::ofstream(path) << "threads: 1\ncores: 2\nstages:\n" + data_stages("train", 1, true) +
                             "  - {type: train_step, name: student, queue_capacity: 2, params: "
                             "{classes: 4, image_size: 32, patch_size: 8, dim: 48, depth: 4, "
                             "heads: 3, alpha: 1, lr: 0.002, warmup_steps: 2}}\n";
  return path;
}

std::vector<std::string> args(const std::string& config,
                              const std::string& dir,
                              std::vector<std::string> extra) {
  std::vector<std::string> out = {config, "stages.student.params.checkpoint_dir=" + dir};
  out.insert(out.end(), extra.begin(), extra.end());
  return out;
}

// The keys that put the two partitions on two ranks.
std::vector<std::string> on_two_ranks(const std::string& schedule, int chunks_per_partition) {
  return {"--nproc",
          "2",
          "stages.source.params.ranks_per_shard=2",
          "stages.student.params.partitions=2",
          "stages.student.params.microbatches=4",
          "stages.student.params.intraop_threads=1",
          "stages.student.params.partition_schedule=" + schedule,
          "stages.student.params.chunks_per_partition=" + std::to_string(chunks_per_partition)};
}

// Removes `files` from `out` (back to an earlier step's checkpoints), runs `extra` again and
// checks that the run resumed at `step` and ended bit-identical to `uninterrupted`.
void check_exact_resume(const std::string& config,
                        const std::string& out,
                        const std::vector<std::string>& extra,
                        const std::vector<std::string>& files,
                        int step,
                        const std::string& uninterrupted) {
  for (const std::string& file : files) REQUIRE(fs::remove(out + "/" + file));
  const Exit resumed = run_cli(args(config, out, extra));
  REQUIRE_MESSAGE(resumed.code == 0, resumed.output);
  CHECK(resumed.output.find("resumed_at " + std::to_string(step)) != std::string::npos);
  CHECK(max_weight_difference(uninterrupted, out + "/final.pt") == 0);
}

}  // namespace

// Two ranks, each holding half the model, end where one process running the same partitions as
// two nodes of its graph ends (bit for bit: the same sums in the same order), and where the unpartitioned
// model ends within 1e-5, for every schedule. Each rank keeps only its partition's optimizer
// state, and the run resumes exactly from those files.
TEST_CASE("Dist.Pipeline.TwoRanksTrainToTheOneProcessWeights" * doctest::timeout(900)) {
  TempDir dir("pp");
  const std::string config = write_config(dir);
  const Exit whole =
      run_cli(args(config, dir / "whole", {"stages.student.params.intraop_threads=1"}));
  REQUIRE_MESSAGE(whole.code == 0, whole.output);
  const Exit nodes = run_cli(args(config, dir / "nodes",
                                  {"threads=2", "stages.student.params.partitions=2",
                                   "stages.student.params.microbatches=4",
                                   "stages.student.params.intraop_threads=1"}));
  REQUIRE_MESSAGE(nodes.code == 0, nodes.output);
  CHECK(nodes.output.find("student/partition1") != std::string::npos);
  for (const auto& [schedule, chunks_per_partition] :
       std::vector<std::pair<std::string, int>>{{"1f1b", 1}, {"gpipe", 1}, {"interleaved", 2}}) {
    CAPTURE(schedule);
    const std::string out = dir / ("ranks-" + schedule);
    const Exit ranks = run_cli(args(config, out, on_two_ranks(schedule, chunks_per_partition)));
    REQUIRE_MESSAGE(ranks.code == 0, ranks.output);
    CHECK(train::read_checkpoint(out + "/final.pt").state.step == 10);
    const double from_whole = max_weight_difference(dir / "whole/final.pt", out + "/final.pt");
    MESSAGE(schedule << " on 2 ranks vs the whole model: largest weight difference "
                     << from_whole);
    CHECK(from_whole < 1e-5);
    if (schedule == "1f1b") {
      CHECK(max_weight_difference(dir / "nodes/final.pt", out + "/final.pt") == 0);
      // Rank 0's report charts both ranks' actions of the last step, and each rank holds
      // about half the optimizer state.
      CHECK(ranks.output.find("pipeline_bubble") != std::string::npos);
      // A rank counts what it keeps, the activations it received included, as the partition
      // nodes of one process do.
      const double peak_mb = printed(ranks.output, "peak_partition_mb");
      const double nodes_mb = printed(nodes.output, "peak_partition_mb");
      MESSAGE("peak partition memory: " << peak_mb << " MB on rank 0, " << nodes_mb
                                        << " MB in one process");
      CHECK(peak_mb == doctest::Approx(nodes_mb).epsilon(0.25));
      CHECK(ranks.output.find("'student' timeline of item 10 (") != std::string::npos);
      CHECK(ranks.output.find("\n  partition 1  ") != std::string::npos);
      // AdamW keeps two float32 moments per parameter.
      std::int64_t params = 0;
      const train::ImageModel model = train::load_model(train::read_checkpoint(out + "/final.pt"));
      for (const auto& p : model->parameters()) params += p.numel();
      const double full_mb = static_cast<double>(params) * 8 / 1e6;
      const double rank0_mb = printed(ranks.output, "optimizer_state_mb");
      MESSAGE("optimizer state: " << full_mb << " MB whole, " << rank0_mb << " MB on rank 0");
      CHECK(rank0_mb / full_mb == doctest::Approx(0.5).epsilon(0.2));
    }
  }

  // Checkpoints every 2 steps, each rank its own file: resumed from step 6, the run ends where
  // the uninterrupted one did, bit for bit. The split is measured (rank 0's, which both ranks
  // use and record), and a resumed run keeps it; where the model is split does not change
  // the weights.
  std::vector<std::string> resuming = on_two_ranks("1f1b", 1);
  resuming.insert(resuming.end(), {"stages.student.params.checkpoint_every=2",
                                   "stages.student.params.keep_checkpoints=3",
                                   "stages.student.params.resume=true",
                                   "stages.student.params.partition_balance=measured"});
  const std::string out = dir / "resumed";
  const Exit measured = run_cli(args(config, out, resuming));
  REQUIRE_MESSAGE(measured.code == 0, measured.output);
  CHECK(max_weight_difference(dir / "ranks-1f1b/final.pt", out + "/final.pt") == 0);
  const std::vector<int> splits = train::read_checkpoint(out + "/final.pt").state.pipeline_splits;
  REQUIRE(splits.size() == 1);
  CHECK(train::read_checkpoint(out + "/final.pt.rank1").state.pipeline_splits == splits);
  CHECK(printed(measured.output, "pipeline_split_1") == splits[0]);
  std::vector<std::string> files;
  for (const std::string name : {"final.pt", "step-00000010.pt", "step-00000008.pt"}) {
    files.insert(files.end(), {name, name + ".rank1"});
  }
  check_exact_resume(config, out, resuming, files, 6, dir / "ranks-1f1b/final.pt");
}

// Pipeline and data parallelism together: 4 ranks are 2 pipelines of 2 partitions, the
// pipelines reading different halves of the data. Each partition's gradients are averaged over
// its replica in the other pipeline, so the weights end where 2 data-parallel ranks of the whole
// model end (within 1e-5: the micro-batches sum in another order), and a run resumed from its
// step files ends bit-identical. With zero: 1 each rank keeps half its partition's optimizer
// state (its replica the other half), with zero: 2 half its gradients too (and no bucket
// buffers), and the weights do not change.
TEST_CASE("Dist.Pipeline.TwoPipelinesOfTwoRanksAreDataParallel" * doctest::timeout(900)) {
  TempDir dir("pp-dp");
  const std::string config = write_config(dir);
  // Four ranks on two cores: granted 2 each by declaring 8 (slow, but only correctness).
  const Exit data_parallel = run_cli(args(
      config, dir / "dp", {"--nproc", "2", "stages.student.params.intraop_threads=1"}));
  REQUIRE_MESSAGE(data_parallel.code == 0, data_parallel.output);
  std::vector<std::string> both = on_two_ranks("1f1b", 1);
  both[1] = "4";
  both.insert(both.end(), {"cores=8", "stages.student.params.checkpoint_every=2",
                           "stages.student.params.keep_checkpoints=2",
                           "stages.student.params.resume=true"});
  const std::string out = dir / "pp-dp";
  const Exit run = run_cli(args(config, out, both));
  REQUIRE_MESSAGE(run.code == 0, run.output);
  CHECK(train::read_checkpoint(out + "/final.pt").state.step == 5);
  const double difference = max_weight_difference(dir / "dp/final.pt", out + "/final.pt");
  MESSAGE("2 pipelines x 2 partitions vs 2 data-parallel ranks: largest weight difference "
          << difference);
  CHECK(difference < 1e-5);
  CHECK(run.output.find("\n  partition 1  ") != std::string::npos);
  CHECK(run.output.find("rank 3: wall") != std::string::npos);

  std::vector<std::string> sharded = both;
  sharded.push_back("stages.student.params.zero=1");
  const Exit zero = run_cli(args(config, dir / "pp-dp-zero", sharded));
  REQUIRE_MESSAGE(zero.code == 0, zero.output);
  CHECK(max_weight_difference(out + "/final.pt", dir / "pp-dp-zero/final.pt") == 0);
  const double partition_mb = printed(run.output, "optimizer_state_mb");
  const double share_mb = printed(zero.output, "optimizer_state_mb");
  MESSAGE("optimizer state on rank 0: " << partition_mb << " MB, " << share_mb << " MB with zero");
  CHECK(share_mb / partition_mb == doctest::Approx(0.5).epsilon(0.25));
  // zero: 2 reduces each of the partition's gradients to the replica that updates it.
  sharded.back() = "stages.student.params.zero=2";
  const Exit zero2 = run_cli(args(config, dir / "pp-dp-zero2", sharded));
  REQUIRE_MESSAGE(zero2.code == 0, zero2.output);
  CHECK(max_weight_difference(out + "/final.pt", dir / "pp-dp-zero2/final.pt") == 0);
  const double gradient_mb = printed(zero.output, "gradient_mb");
  const double gradient_share_mb = printed(zero2.output, "gradient_mb");
  MESSAGE("gradients on rank 0: " << gradient_mb << " MB, " << gradient_share_mb
                                  << " MB with zero: 2");
  CHECK(gradient_share_mb / gradient_mb == doctest::Approx(0.25).epsilon(0.3));

  fs::copy_file(out + "/final.pt", dir / "uninterrupted.pt");
  // Back to step 4's files.
  check_exact_resume(config, out, both,
                     {"final.pt", "final.pt.rank1", "final.pt.rank2", "final.pt.rank3"}, 4,
                     dir / "uninterrupted.pt");
}

// Distillation with the student's partitions on 2 ranks: only the last partition uses the
// teacher's outputs, so with teacher_infer's ranks_per_shard the teacher runs on rank 1 only,
// and the weights are those of both ranks running it.
TEST_CASE("Dist.Pipeline.TeacherRunsOnTheLastRankOnly" * doctest::timeout(600)) {
  TempDir dir("pp-kd");
  const Exit teacher = run_cli(args(write_config(dir), dir / "teacher", {}));
  REQUIRE_MESSAGE(teacher.code == 0, teacher.output);
  const std::string config = dir / "kd.yaml";
  std::ofstream(config) << "threads: 1\ncores: 2\nstages:\n" + data_stages("train", 1, true) +
                               "  - {type: teacher_infer, name: teacher, params: {model: " +
                               (dir / "teacher/final.pt") +
                               "}}\n"
                               "  - {type: train_step, name: student, queue_capacity: 2, params: "
                               "{classes: 4, image_size: 32, patch_size: 8, dim: 48, depth: 4, "
                               "heads: 3, alpha: 0.5, lr: 0.002, warmup_steps: 2}}\n";
  std::vector<Exit> runs;
  for (const std::string k : {"1", "2"}) {
    std::vector<std::string> two = on_two_ranks("1f1b", 1);
    two.push_back("stages.teacher.params.ranks_per_shard=" + k);
    runs.push_back(run_cli(args(config, dir / ("kd-" + k), two)));
    REQUIRE_MESSAGE(runs.back().code == 0, runs.back().output);
  }
  CHECK(max_weight_difference(dir / "kd-1/final.pt", dir / "kd-2/final.pt") == 0);
  // Rank 0's report: its teacher ran on every image, then on none.
  CHECK(runs[0].output.find("results of 'teacher': images 320") != std::string::npos);
  CHECK_MESSAGE(runs[1].output.find("results of 'teacher': images 0\n") != std::string::npos,
                runs[1].output);
}

// Ranks of a pipeline reading different samples (the source sharded by rank, as for data
// parallelism) fail at the first batch, saying what to set.
TEST_CASE("Dist.Pipeline.RanksOnDifferentSamplesFailByName" * doctest::timeout(300)) {
  TempDir dir("pp-shard");
  std::vector<std::string> two = on_two_ranks("1f1b", 1);
  two.erase(two.begin() + 2);  // ranks_per_shard
  const Exit run = run_cli(args(write_config(dir), dir / "out", two));
  CHECK(run.code != 0);
  CHECK_MESSAGE(run.output.find("the ranks of a pipeline must read the same batches (give the "
                                "training source ranks_per_shard: <partitions>)") !=
                    std::string::npos,
                run.output);
}

// Ranks that are not a multiple of the partitions cannot form pipelines: every rank says so
// before the first step.
TEST_CASE("Dist.Pipeline.PartitionsMustDivideTheRanks" * doctest::timeout(300)) {
  TempDir dir("pp-divide");
  std::vector<std::string> three = on_two_ranks("1f1b", 1);
  three[1] = "3";
  three[2] = "stages.source.params.ranks_per_shard=1";
  three.push_back("cores=6");
  const Exit run = run_cli(args(write_config(dir), dir / "out", three));
  CHECK(run.code != 0);
  CHECK_MESSAGE(run.output.find("with 3 ranks, partitions (2) must be 2 or more and divide the "
                                "ranks") != std::string::npos,
                run.output);
}
