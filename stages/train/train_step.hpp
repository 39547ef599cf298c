#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "graph/registry.hpp"
#include "stages/data/batch.hpp"
#include "stages/train/folder_lock.hpp"
#include "stages/train/step_record.hpp"
#include "stages/train/trainer.hpp"

namespace flowtrain::train {

/// One training step per batch, through a Trainer: forward, loss (distillation when the batch
/// carries teacher outputs, else supervised), backward, gradient clipping, AdamW with warm-up +
/// cosine; with data parallelism the gradient all-reduce overlaps backward.
///
/// The step is serial and takes batches in order, so the update of step t is complete before
/// the forward of step t+1 begins, while the data and teacher stages work ahead on later
/// batches: the loop is exact whatever their concurrency. A non-finite loss or gradient stops
/// the run with an error naming the step, or (on_nonfinite: skip) skips the update and counts it.
///
/// After each step it emits a StepRecord, with the bytes of a checkpoint (every
/// checkpoint_every steps, and at the end: final.pt, or a resumable step file after a stop) or
/// a snapshot when one is due. A config entry whose output no stage takes brings the nodes
/// that write them (expand): `<name>/step_log`, `<name>/checkpoint`, `<name>/snapshot`. With
/// resume: true the newest checkpoint in checkpoint_dir is restored and the run continues
/// exactly where it stopped. (`student_step` is its former name, still accepted.)
class TrainStepStage final : public FlatMap<data::Batch, StepRecord> {
 public:
  explicit TrainStepStage(const Params& params);
  ~TrainStepStage() override;
  static StageDoc describe();
  static std::vector<ExpandedNode> expand(const Params& params);

  bool requires_order() const override { return true; }
  std::size_t threads_per_invocation() const override { return intraop_threads_; }
  bool intra_op_parallel() const override { return true; }
  /// One record per batch, and one at the end with a checkpoint_dir.
  std::optional<std::uint64_t> plan(std::optional<std::uint64_t> batches) override;
  std::optional<std::uint64_t> resume_position() const override;
  std::vector<StageResult> results() const override;
  /// step, total_steps, epoch (1-based), loss (smoothed over recent steps), images.
  std::vector<StageResult> live_results() const override;

  const std::vector<StepRecord>& history() const { return history_; }
  const TrainState& state() const { return trainer_->state(); }
  ViT& model() { return trainer_->model(); }

 protected:
  void process(data::Batch&& batch, Emitter<StepRecord>& out) override;
  void finish(Emitter<StepRecord>& out) override;

 private:
  std::unique_ptr<Trainer> trainer_;
  std::unique_ptr<FolderLock> lock_;  // this run's claim on checkpoint_dir
  int intraop_threads_;
  std::uint64_t configured_total_steps_;
  bool writes_checkpoints_;
  std::uint64_t checkpoint_every_;
  std::uint64_t snapshot_every_;

  std::uint64_t steps_this_run_ = 0;
  // Per-step time split, summed over this run.
  // data_wait: from the end of one step to the start of the next (the input was not ready).
  double forward_s_ = 0, backward_s_ = 0, sync_s_ = 0, optimizer_s_ = 0, checkpoint_s_ = 0;
  double data_wait_s_ = 0;
  std::chrono::steady_clock::time_point last_step_end_, run_begin_;
  std::vector<StepRecord> history_;  // without file bytes
  // What live_results() shows: written after each step, read by the progress sampler's thread.
  std::atomic<std::uint64_t> live_step_{0}, live_epoch_{0}, live_images_{0};
  std::atomic<double> live_loss_{0};
};

/// The ViT a training stage builds from its params: a preset (model, image_size, classes,
/// regression_outputs) with optional overrides of its shape (patch_size, dim, depth, heads,
/// dropout; 0 keeps the preset's).
std::vector<ParamSpec> vit_param_specs();
ViTConfig vit_config_from(const Params& params);

}  // namespace flowtrain::train
