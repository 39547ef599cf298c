#include "stages/train/step/step_writers.hpp"

#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "graph/atomic_file.hpp"
#include "graph/csv.hpp"
#include "graph/error.hpp"
#include "graph/tensorboard.hpp"
#include "stages/train/files/checkpoint.hpp"

namespace flowtrain::train {

namespace fs = std::filesystem;

namespace {
void create_folder(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error("cannot create " + dir.string() + ": " + ec.message());
}
// Keeps the header and the rows of steps before `step` in the steps.csv at `path`: a run
// killed after its last checkpoint logged steps that its resumption takes again (and perhaps
// half a row, cut by the kill).
void keep_rows_before(const std::string& path, std::uint64_t step) {
  std::ifstream in(path);
  std::string kept, line;
  bool header = true;
  while (std::getline(in, line)) {
    if (in.eof()) break;  // no line break: a row the kill cut
    std::uint64_t row_step = 0;
    if (header || (std::sscanf(line.c_str(), "%" SCNu64 ",", &row_step) == 1 && row_step < step)) {
      kept += line + "\n";
    }
    header = false;
  }
  in.close();
  write_file_atomically(path, kept);
}

}  // namespace

// A rehearsal's writers (autotune timing a layout on a throwaway copy) write nothing.
StepLogStage::StepLogStage(const Options& options, const BuildContext& context)
    : dir_(context.rehearsal() ? std::string() : options.dir),
      events_(context.rehearsal() ? nullptr : context.find<EventWriter>()) {}

StageDoc StepLogStage::describe() {
  return {
      "Appends one row per training step (step, epoch, loss, correct, seen, lr, time_s) to "
      "dir/steps.csv on rank 0; a resumed run continues the file from its checkpoint's step "
      "(the rows of steps it takes again are dropped).",
      option_specs<Options>()};
}

void StepLogStage::consume(StepRecord&& record, ItemContext&) {
  if (record.rank != 0 || record.step == 0) return;
  if (events_) {
    const auto step = static_cast<std::int64_t>(record.step);
    events_->scalar("train/loss", step, record.loss);
    events_->scalar("train/lr", step, record.lr);
    if (record.seen > 0) {
      events_->scalar("train/top1", step,
                      static_cast<double>(record.correct) / static_cast<double>(record.seen));
    }
    if (record.time_s > record.begin_s) {
      events_->scalar("train/images_per_s", step,
                      static_cast<double>(record.seen) / (record.time_s - record.begin_s));
    }
  }
  if (dir_.empty()) return;
  if (!file_.is_open()) {
    // The first step of a new run is step 1; a resumed run starts later and continues the file.
    const std::string path = (fs::path(dir_) / "steps.csv").string();
    create_folder(dir_);
    const bool fresh = record.step == 1 || !fs::exists(path);
    if (!fresh) keep_rows_before(path, record.step);
    file_.open(path, fresh ? std::ios::trunc : std::ios::app);
    if (!file_) throw Error("cannot write " + path);
    if (fresh) file_ << "step,epoch,loss,correct,seen,lr,time_s\n";
  }
  // Flushed per row: a run killed at any point leaves every finished step's row.
  file_ << csv_line({std::to_string(record.step), std::to_string(record.epoch + 1),
                     csv_number(record.loss), std::to_string(record.correct),
                     std::to_string(record.seen), csv_number(record.lr),
                     csv_number(record.time_s, "%.3f")})
        << std::flush;
  if (!file_) throw Error("cannot write " + (fs::path(dir_) / "steps.csv").string());
}

CheckpointStage::CheckpointStage(const Options& options, const BuildContext& context)
    : dir_(options.dir), keep_(options.keep), rehearsal_(context.rehearsal()) {
  if (dir_.empty()) throw Error("param 'dir' is required");
}

StageDoc CheckpointStage::describe() {
  return {
      "Writes the checkpoints a training step sends (weights, optimizer state, RNG, data "
      "position) to dir atomically, one file per rank, and deletes the step files "
      "beyond the newest `keep` that every rank completed.",
      option_specs<Options>()};
}

void CheckpointStage::consume(StepRecord&& record, ItemContext&) {
  if (!record.checkpoint || rehearsal_) return;
  create_folder(dir_);
  // Each rank writes its own file: its data position, and with ZeRO its optimizer shard.
  write_file_atomically(rank_file((fs::path(dir_) / record.checkpoint_name).string(), record.rank),
                        *record.checkpoint);
  ++written_;
  // Keeps every rank's files from the newest `keep` steps that all ranks completed on (a rank
  // that stops early may have written a step no other reached). Whichever rank writes a step
  // last sees it completed, and deletes the older files of every rank.
  std::error_code ec;
  for (const std::string& path : stale_step_checkpoints(dir_, record.world_size, keep_)) {
    fs::remove(path, ec);
  }
}

std::vector<StageResult> CheckpointStage::results() const {
  return {{"written", static_cast<double>(written_)}};
}

SnapshotStage::SnapshotStage(const Options& options, const BuildContext& context)
    : dir_(options.dir), rehearsal_(context.rehearsal()) {
  if (dir_.empty()) throw Error("param 'dir' is required");
}

StageDoc SnapshotStage::describe() {
  return {
      "Writes the model snapshots a training step sends (the weights alone) to "
      "dir/snapshots/, to validate the model along the training.",
      option_specs<Options>()};
}

void SnapshotStage::consume(StepRecord&& record, ItemContext&) {
  if (!record.snapshot || rehearsal_) return;
  const fs::path dir = fs::path(dir_) / "snapshots";
  create_folder(dir);
  write_file_atomically((dir / step_checkpoint_name(record.step)).string(), *record.snapshot);
  ++written_;
}

std::vector<StageResult> SnapshotStage::results() const {
  return {{"written", static_cast<double>(written_)}};
}

FLOWTRAIN_REGISTER_STAGE("step_log", StepLogStage);
FLOWTRAIN_REGISTER_STAGE("checkpoint", CheckpointStage);
FLOWTRAIN_REGISTER_STAGE("snapshot", SnapshotStage);

}  // namespace flowtrain::train
