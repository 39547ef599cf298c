#include <doctest/doctest.h>
#include <signal.h>
#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "stages/train/checkpoint.hpp"
#include "tests/process.hpp"
#include "tests/train/training_fixture.hpp"

using namespace flowtrain;
using namespace flowtrain::train;
using namespace flowtrain::testing;
namespace fs = std::filesystem;

namespace {

// Starts `flowtrain run config overrides...`.
Process start_run(const std::string& config,
                  const std::string& override_text,
                  const std::string& log) {
  return spawn({FLOWTRAIN_CLI, "run", config, override_text}, {}, log);
}

bool has_step_checkpoint(const std::string& dir) { return !step_checkpoints(dir).empty(); }

// A run interrupted by `signal` as soon as its first checkpoint is on disk, then resumed, ends
// with the same weights, bit for bit, as a run that was never interrupted: same batches from the
// same data position, optimizer state, schedule and random state (dropout is on, so the RNG
// state matters).
void check_interrupted_run_resumes_exactly(int signal) {
  TempDir dir("resume");
  const std::string config = dir / "train.yaml";
  std::ofstream(config) << "threads: 2\nstages:\n" + data_stages("train", 4, true) +
                               "  - {type: student_step, queue_capacity: 2, params: {classes: 4, "
                               "image_size: 32, patch_size: 8, dim: 48, depth: 2, heads: 3, "
                               "dropout: 0.1, alpha: 1, lr: 0.002, warmup_steps: 3, "
                               "checkpoint_every: 2, resume: true}}\n";
  const auto checkpoint_dir = [&](const std::string& run) {
    return "stages.student_step.params.checkpoint_dir=" + (dir / run);
  };

  // The reference: never interrupted.
  REQUIRE(wait_for(start_run(config, checkpoint_dir("whole"), dir / "whole.log"), 120).code == 0);
  REQUIRE(fs::exists(dir / "whole/final.pt"));

  const Process interrupted = start_run(config, checkpoint_dir("stopped"), dir / "stopped.log");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!has_step_checkpoint(dir / "stopped") && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  REQUIRE(has_step_checkpoint(dir / "stopped"));
  kill(interrupted.pid, signal);
  const Exit stop = wait_for(interrupted, 60);
  if (signal == SIGKILL) {
    REQUIRE(stop.signal == SIGKILL);
  } else {
    // Stopped cleanly: a resumable checkpoint of the last whole batch, never a partial one.
    REQUIRE(stop.code == 130);
    CHECK(stop.output.find("stopped by SIGINT") != std::string::npos);
  }
  REQUIRE_FALSE(fs::exists(dir / "stopped/final.pt"));  // it really stopped mid-run
  const Checkpoint stopped_at = read_checkpoint(*latest_checkpoint(dir / "stopped"));
  CHECK(stopped_at.state.data_position == stopped_at.state.step * 32);

  const Exit resumed_run = wait_for(start_run(config, checkpoint_dir("stopped"), dir / "resumed.log"), 120);
  REQUIRE(resumed_run.code == 0);
  CHECK(resumed_run.output.find("resumed_at " + std::to_string(stopped_at.state.step)) !=
        std::string::npos);

  const Checkpoint whole = read_checkpoint(dir / "whole/final.pt");
  const Checkpoint resumed = read_checkpoint(dir / "stopped/final.pt");
  CHECK(whole.state.step == 40);  // 4 epochs x 10 batches
  CHECK(resumed.state.step == whole.state.step);
  CHECK(resumed.state.data_position == whole.state.data_position);
  const ViT a = load_model(whole), b = load_model(resumed);
  const auto pa = a->named_parameters(), pb = b->named_parameters();
  REQUIRE(pa.size() == pb.size());
  std::size_t equal = 0;
  for (const auto& item : pa) equal += torch::equal(item.value(), pb[item.key()]) ? 1 : 0;
  CHECK(equal == pa.size());
}

}  // namespace

TEST_CASE("Train.Resume.SigkillThenResumeIsBitExact" * doctest::timeout(300)) {
  check_interrupted_run_resumes_exactly(SIGKILL);
}

// Ctrl-C used to checkpoint a partial batch (19 of 32 images), and the resumed run then took 41
// steps with other weights.
TEST_CASE("Train.Resume.SigintThenResumeIsBitExact" * doctest::timeout(300)) {
  check_interrupted_run_resumes_exactly(SIGINT);
}
