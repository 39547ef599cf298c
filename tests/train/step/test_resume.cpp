#include <doctest/doctest.h>
#include <signal.h>
#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "stages/data/splitmix.hpp"
#include "stages/train/files/checkpoint.hpp"
#include "stages/train/models/vit.hpp"
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

// The training step of these tests' jobs, a ViT 48/2/3 on 4 classes of 32x32 images, with
// `params` after the model's and the optimizer's.
std::string student_step(const std::string& params) {
  return "  - {type: student_step, queue_capacity: 2, params: {classes: 4, image_size: 32, "
         "patch_size: 8, dim: 48, depth: 2, heads: 3, alpha: 1, lr: 0.002, warmup_steps: 3, " +
         params + "}}\n";
}

// The step column of a steps.csv, row by row.
std::vector<int> logged_steps(const std::string& csv_path) {
  std::ifstream csv(csv_path);
  std::string line;
  std::getline(csv, line);
  std::vector<int> steps;
  while (std::getline(csv, line)) steps.push_back(std::stoi(line.substr(0, line.find(','))));
  return steps;
}

// 1, 2, ..., n.
std::vector<int> first_steps(int n) {
  std::vector<int> out(static_cast<std::size_t>(n));
  std::iota(out.begin(), out.end(), 1);
  return out;
}

// A run interrupted by `signal` as soon as its first checkpoint is on disk, then resumed, ends
// with the same weights, bit for bit, as a run that was never interrupted: same batches from the
// same data position, optimizer state, schedule and random state (dropout is on, so the RNG
// state matters).
void check_interrupted_run_resumes_exactly(int signal) {
  TempDir dir("resume");
  const std::string config = dir / "train.yaml";
  std::ofstream(config) << "threads: 2\nstages:\n" + data_stages("train", 4, true) +
                               student_step("dropout: 0.1, checkpoint_every: 2, resume: true");
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
  const Checkpoint stopped_at = *latest_checkpoint(dir / "stopped");
  CHECK(stopped_at.state.data_position == stopped_at.state.step * 32);

  const Exit resumed_run =
      wait_for(start_run(config, checkpoint_dir("stopped"), dir / "resumed.log"), 120);
  REQUIRE(resumed_run.code == 0);
  CHECK(resumed_run.output.find("resumed_at " + std::to_string(stopped_at.state.step)) !=
        std::string::npos);

  // steps.csv has each step once, in order: the rows the stopped run logged after its
  // checkpoint were dropped when the resumed run took those steps again.
  CHECK(logged_steps(dir / "stopped/steps.csv") == first_steps(40));

  const Checkpoint whole = read_checkpoint(dir / "whole/final.pt");
  const Checkpoint resumed = read_checkpoint(dir / "stopped/final.pt");
  CHECK(whole.state.step == 40);  // 4 epochs x 10 batches
  CHECK(resumed.state.step == whole.state.step);
  CHECK(resumed.state.data_position == whole.state.data_position);
  const ImageModel a = load_model(whole), b = load_model(resumed);
  const auto pa = a->named_parameters(), pb = b->named_parameters();
  REQUIRE(pa.size() == pb.size());
  std::size_t equal = 0;
  for (const auto& item : pa) equal += torch::equal(item.value(), pb[item.key()]) ? 1 : 0;
  CHECK(equal == pa.size());
}

// The final weights of `path`'s model equal `other`'s, tensor for tensor.
bool same_weights(const std::string& path, const std::string& other) {
  const ImageModel a = load_model(read_checkpoint(path)), b = load_model(read_checkpoint(other));
  const auto pa = a->named_parameters(), pb = b->named_parameters();
  if (pa.size() != pb.size()) return false;
  for (const auto& item : pa) {
    if (!torch::equal(item.value(), pb[item.key()])) return false;
  }
  return true;
}

// A .tmp file in `dir`: a checkpoint write under way (or one a killed run left behind).
bool writing_checkpoint(const fs::path& dir) {
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    if (it->path().extension() == ".tmp") return true;
  }
  return false;
}

}  // namespace

// The fault battery's kill test: a two-phase run (teacher, then a student distilled from it)
// SIGKILLed at several points drawn from a fixed seed, one of them aimed inside a checkpoint
// write (a .tmp file on disk), and resumed each time, ends with both models bit-identical to an
// uninterrupted run's.
TEST_CASE("Train.Resume.KilledAtRandomPointsOfTwoPhasesThenResumedIsBitExact" *
          doctest::timeout(900)) {
  TempDir dir("battery");
  // data_stages is written for a single pipeline: its stage lines indented into a phase.
  const auto phase_data = [] {
    std::string lines, text = data_stages("train", 3, true);
    for (std::size_t at = 0, next; at < text.size(); at = next + 1) {
      next = text.find('\n', at);
      lines += "    " + text.substr(at, next - at) + "\n";
    }
    return lines;
  };
  const auto write_config = [&](const std::string& out) {
    const auto train_step = [&](const std::string& name, int dim, const char* alpha) {
      return "      - {type: train_step, name: " + name +
             ", queue_capacity: 2, params: {classes: 4, image_size: 32, patch_size: 8, dim: " +
             std::to_string(dim) + ", depth: 2, heads: 3, dropout: 0.1, alpha: " + alpha +
             ", lr: 0.002, warmup_steps: 3, checkpoint_every: 3, resume: true, checkpoint_dir: " +
             (dir / (out + "/" + name)) + "}}\n";
    };
    const std::string path = dir / (out + ".yaml");
    std::ofstream(path) << "threads: 2\nphases:\n  - name: teacher\n    stages:\n" + phase_data() +
                               train_step("teacher", 48, "1") + "  - name: student\n    stages:\n" +
                               phase_data() + "      - {type: teacher_infer, params: {model: " +
                               (dir / (out + "/teacher/final.pt")) + "}}\n" +
                               train_step("student", 24, "0.5");
    return path;
  };
  const std::string whole_config = write_config("whole"), killed_config = write_config("killed");
  const auto run = [&](const std::string& out, const std::string& log) {
    return spawn({FLOWTRAIN_CLI, "run", out == "whole" ? whole_config : killed_config}, {}, log);
  };
  const Exit whole = wait_for(run("whole", dir / "whole.log"), 300);
  REQUIRE(whole.code == 0);

  std::uint64_t draw = 12345;
  int kills = 0;
  bool killed_inside_a_write = false;
  for (int attempt = 0; attempt < 8 && kills < 5; ++attempt) {
    const Process p = run("killed", dir / ("killed" + std::to_string(attempt) + ".log"));
    draw = data::splitmix64(draw);
    const auto start = std::chrono::steady_clock::now();
    // Between 5% and 30% of a whole run's time: a resumed run has less left to do.
    const auto delay =
        std::chrono::duration<double>(whole.seconds * (0.05 + 0.25 * (draw % 1000) / 1000.0));
    bool in_write = false;
    // The second kill waits for a checkpoint write (up to a whole run's time) instead.
    const auto wait = kills == 1 ? std::chrono::duration<double>(whole.seconds) : delay;
    while (std::chrono::steady_clock::now() - start < wait) {
      if (kills == 1 && (writing_checkpoint(dir / "killed/teacher") ||
                         writing_checkpoint(dir / "killed/student"))) {
        in_write = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(kills == 1 ? 50 : 5000));
    }
    kill(p.pid, SIGKILL);
    const Exit e = wait_for(p, 60);
    if (e.signal != SIGKILL) {  // it finished first: the run is complete
      REQUIRE_MESSAGE(e.code == 0, e.output);
      break;
    }
    ++kills;
    killed_inside_a_write = killed_inside_a_write || in_write;
  }
  const Exit last = wait_for(run("killed", dir / "last.log"), 300);
  REQUIRE(last.code == 0);
  MESSAGE(kills << " kills, " << std::string(killed_inside_a_write ? "one" : "none")
                << " inside a checkpoint write");
  CHECK(kills >= 3);
  for (const std::string name : {"teacher", "student"}) {
    CHECK(same_weights(dir / ("whole/" + name + "/final.pt"),
                       dir / ("killed/" + name + "/final.pt")));
    CHECK_FALSE(writing_checkpoint(dir / ("killed/" + name)));
  }
}

TEST_CASE("Train.Resume.SigkillThenResumeIsBitExact" * doctest::timeout(300)) {
  check_interrupted_run_resumes_exactly(SIGKILL);
}

// Ctrl-C used to checkpoint a partial batch (19 of 32 images), and the resumed run then took 41
// steps with other weights.
TEST_CASE("Train.Resume.SigintThenResumeIsBitExact" * doctest::timeout(300)) {
  check_interrupted_run_resumes_exactly(SIGINT);
}

// A full disk while checkpointing used to abort the process (exit 134, a c10::Error through ~27
// stack frames) and leave step-N.pt.tmp behind. /dev/full fails every write with ENOSPC: the
// final checkpoint's temporary is a link to it.
TEST_CASE("Train.Cli.FullDiskWhileCheckpointingIsOneLine" * doctest::timeout(120)) {
  if (!fs::exists("/dev/full")) {
    MESSAGE("no /dev/full on this machine: not checked");
    return;
  }
  TempDir dir("full");
  const std::string config = dir / "train.yaml";
  std::ofstream(config) << "threads: 2\nstages:\n" + data_stages("train", 1, true) +
                               "  - {type: train_step, params: {classes: 4, image_size: 32, "
                               "patch_size: 8, dim: 24, depth: 1, heads: 2, alpha: 1, "
                               "checkpoint_dir: " +
                               (dir / "run") + "}}\n";
  fs::create_directories(dir / "run");
  fs::create_symlink("/dev/full", dir / "run/final.pt.tmp");
  const Exit e = wait_for(spawn({FLOWTRAIN_CLI, "run", config}, {}, dir / "run.log"), 100);
  CHECK(e.code == 1);
  const std::string expected = "cannot write " + (dir / "run/final.pt") + ": writing " +
                               (dir / "run/final.pt.tmp") + " failed (No space left on device)";
  CHECK_MESSAGE(e.output.find(expected) != std::string::npos, e.output);
  CHECK_MESSAGE(e.output.find("stage 'train_step/checkpoint'") != std::string::npos, e.output);
  CHECK(e.output.find("terminate called") == std::string::npos);
  CHECK_FALSE(fs::exists(dir / "run/final.pt"));
  CHECK_FALSE(fs::is_symlink(dir / "run/final.pt.tmp"));
}

// A job killed after its last step's checkpoint, before final.pt, resumed: no step is left, and
// the run writes final.pt from that step (the weights the uninterrupted run's final.pt holds).
TEST_CASE("Train.Resume.EveryStepDoneWritesTheFinalCheckpoint" * doctest::timeout(300)) {
  TempDir dir("resume-end");
  const std::string config = dir / "train.yaml";
  std::ofstream(config) << "threads: 2\nstages:\n" + data_stages("train", 1, true) +
                               student_step("checkpoint_every: 5, resume: true, checkpoint_dir: " +
                                            (dir / "run"));
  REQUIRE(wait_for(spawn({FLOWTRAIN_CLI, "run", config}, {}, dir / "whole.log"), 120).code == 0);
  REQUIRE(fs::exists(dir / "run/step-00000010.pt"));
  fs::rename(dir / "run/final.pt", dir / "whole.pt");

  const Exit again = wait_for(spawn({FLOWTRAIN_CLI, "run", config}, {}, dir / "again.log"), 120);
  INFO(again.output);
  REQUIRE(again.code == 0);
  CHECK(again.output.find("resumed_at 10") != std::string::npos);
  REQUIRE(fs::exists(dir / "run/final.pt"));
  CHECK(read_checkpoint(dir / "run/final.pt").state.step == 10);
  CHECK(same_weights(dir / "run/final.pt", dir / "whole.pt"));
}

// Behind a mix, a sample's position is the mix's: a run resumed from a step checkpoint takes
// up the mixed order there, trains each step once and ends with the uninterrupted run's weights
// (issue 59: it trained 164 images after the resume instead of 128, steps.csv ran to 19 of 16).
TEST_CASE("Train.Resume.BehindAMixTrainsEachSampleOnce" * doctest::timeout(300)) {
  TempDir dir("resume-mix");
  const std::string config = dir / "train.yaml";
  const std::string data = data_stages("train", 1, true);
  const std::string source = data.substr(0, data.find('\n') + 1);
  std::string other = source;  // the val folder: 160 more images, shuffled by another seed
  other.replace(other.find("name: source"), 12, "name: extra");
  other.replace(other.find("/train,"), 7, "/val,");
  other.replace(other.find("seed: 3"), 7, "seed: 4");
  std::ofstream(config)
      << "threads: 2\nstages:\n" + source + other +
             "  - {type: mix, name: data, inputs: [source, extra], params: {weights: [2, 1], "
             "seed: 1}}\n" + data.substr(data.find('\n') + 1) +
             student_step("dropout: 0.1, checkpoint_every: 5, keep_checkpoints: 3, resume: true");
  const auto run = [&](const std::string& name, const std::string& log) {
    return wait_for(spawn({FLOWTRAIN_CLI, "run", config,
                           "stages.student_step.params.checkpoint_dir=" + (dir / name)},
                          {}, dir / log),
                    120);
  };
  const Exit whole = run("whole", "whole.log");
  INFO(whole.output);
  REQUIRE(whole.code == 0);
  REQUIRE(read_checkpoint(dir / "whole/final.pt").state.step == 15);  // 480 images, 32 a step

  fs::copy(dir / "whole", dir / "cut", fs::copy_options::recursive);
  for (const fs::directory_entry& entry : fs::directory_iterator(dir / "cut")) {
    const std::string file = entry.path().filename().string();
    if (file == "final.pt" || (file.rfind("step-", 0) == 0 && file > "step-00000005.pt")) {
      fs::remove(entry.path());
    }
  }
  const Exit resumed = run("cut", "resumed.log");
  INFO(resumed.output);
  REQUIRE(resumed.code == 0);
  CHECK(resumed.output.find("resumed_at 5") != std::string::npos);
  CHECK(logged_steps(dir / "cut/steps.csv") == first_steps(15));
  CHECK(read_checkpoint(dir / "cut/final.pt").state.data_position == 480);
  CHECK(same_weights(dir / "cut/final.pt", dir / "whole/final.pt"));
}
