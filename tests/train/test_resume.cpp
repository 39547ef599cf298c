#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "stages/train/checkpoint.hpp"
#include "tests/train/training_fixture.hpp"

extern char** environ;

using namespace flowtrain;
using namespace flowtrain::train;
using namespace flowtrain::testing;
namespace fs = std::filesystem;

namespace {

// Starts `flowtrain run config overrides...` with its output in `log`; returns the pid.
pid_t spawn_run(const std::string& config,
                const std::vector<std::string>& overrides,
                const std::string& log) {
  std::vector<std::string> args = {FLOWTRAIN_CLI, "run", config};
  args.insert(args.end(), overrides.begin(), overrides.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, FLOWTRAIN_CLI, &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  REQUIRE(rc == 0);
  return pid;
}

int wait_exit(pid_t pid) {
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

bool has_step_checkpoint(const std::string& dir) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("step-", 0) == 0 && name.size() == step_checkpoint_name(0).size()) return true;
  }
  return false;
}

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
  REQUIRE(wait_exit(spawn_run(config, {checkpoint_dir("whole")}, dir / "whole.log")) == 0);
  REQUIRE(fs::exists(dir / "whole/final.pt"));

  // Killed as soon as its first checkpoint is on disk.
  const pid_t pid = spawn_run(config, {checkpoint_dir("killed")}, dir / "killed.log");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!has_step_checkpoint(dir / "killed") && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  REQUIRE(has_step_checkpoint(dir / "killed"));
  kill(pid, SIGKILL);
  REQUIRE(wait_exit(pid) == 128 + SIGKILL);
  REQUIRE_FALSE(fs::exists(dir / "killed/final.pt"));  // it really died mid-run
  const std::uint64_t killed_at = read_checkpoint(*latest_checkpoint(dir / "killed")).state.step;

  // Resumed from its newest checkpoint.
  REQUIRE(wait_exit(spawn_run(config, {checkpoint_dir("killed")}, dir / "resumed.log")) == 0);
  const std::string log = read_text(dir / "resumed.log");
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
