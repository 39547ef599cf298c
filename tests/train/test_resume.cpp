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

}  // namespace

// A run killed with SIGKILL and resumed ends with the same weights, bit for bit, as a run that
// was never interrupted: same batches from the same data position, optimizer state, schedule
// and random state (dropout is on, so the RNG state matters).
TEST_CASE("Train.Resume.SigkillThenResumeIsBitExact" * doctest::timeout(300)) {
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

  // Killed as soon as its first checkpoint is on disk.
  const Process killed = start_run(config, checkpoint_dir("killed"), dir / "killed.log");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!has_step_checkpoint(dir / "killed") && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  REQUIRE(has_step_checkpoint(dir / "killed"));
  kill(killed.pid, SIGKILL);
  REQUIRE(wait_for(killed, 60).signal == SIGKILL);
  REQUIRE_FALSE(fs::exists(dir / "killed/final.pt"));  // it really died mid-run
  const std::uint64_t killed_at = read_checkpoint(*latest_checkpoint(dir / "killed")).state.step;

  // Resumed from its newest checkpoint.
  const Exit resumed_run = wait_for(start_run(config, checkpoint_dir("killed"), dir / "resumed.log"), 120);
  REQUIRE(resumed_run.code == 0);
  const std::string& log = resumed_run.output;
  CHECK(log.find("resumed_at " + std::to_string(killed_at)) != std::string::npos);

  const Checkpoint whole = read_checkpoint(dir / "whole/final.pt");
  const Checkpoint resumed = read_checkpoint(dir / "killed/final.pt");
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
