#pragma once

#include <atomic>
#include <chrono>
#include <fstream>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "graph/registry.hpp"
#include "stages/data/batch.hpp"
#include "stages/train/checkpoint.hpp"
#include "stages/train/folder_lock.hpp"
#include "stages/train/kd_loss.hpp"
#include "stages/train/optimizer.hpp"
#include "stages/train/vit.hpp"

namespace flowtrain::dist {
class GradSync;
class ShardedOptimizer;
}  // namespace flowtrain::dist

namespace flowtrain::train {

/// One training step per batch: forward, loss (distillation when the batch carries teacher
/// outputs, else supervised), backward, gradient clipping, AdamW with warm-up + cosine.
///
/// The step is serial and takes batches in order, so the update of step t is complete before
/// the forward of step t+1 begins, while the data and teacher stages work ahead on later
/// batches: the loop is exact whatever their concurrency. A non-finite loss or gradient stops
/// the run with an error naming the step, or (on_nonfinite: skip) skips the update and counts it.
/// Checkpoints (model, optimizer, RNG, step, epoch, data position, schedule) go to
/// checkpoint_dir every checkpoint_every steps and at the end (final.pt); with resume: true the
/// newest one is restored and the run continues exactly where it stopped.
class StudentStepStage final : public SerialSink<data::Batch> {
 public:
  explicit StudentStepStage(const Params& params);
  ~StudentStepStage() override;
  static StageDoc describe();

  std::size_t threads_per_invocation() const override { return intraop_threads_; }
  std::optional<std::uint64_t> plan(std::optional<std::uint64_t> batches) override;
  std::optional<std::uint64_t> resume_position() const override;
  std::vector<StageResult> results() const override;
  /// step, total_steps, epoch (1-based), loss (smoothed over recent steps), images.
  std::vector<StageResult> live_results() const override;

  /// One finished step, as recorded for tests and reports.
  struct StepRecord {
    std::uint64_t step = 0;          // 1-based count after this step
    std::uint64_t batch_number = 0;  // Batch::number of its batch
    double loss = 0;
    double lr = 0;
    std::uint64_t correct = 0;  // training predictions that matched the label
    std::uint64_t seen = 0;     // samples in the batch
    std::chrono::steady_clock::time_point begin, end;
  };
  const std::vector<StepRecord>& history() const { return history_; }
  const TrainState& state() const { return state_; }
  ViT& model() { return model_; }

 protected:
  void consume(data::Batch&& batch, ItemContext& ctx) override;
  void finish() override;

 private:
  void save(const std::string& name);
  // Appends one row to checkpoint_dir/steps.csv (rank 0), the curves of a run's report.
  void log_step(const StepRecord& record, std::uint32_t epoch);
  // The AdamW this rank steps: the whole one, or this rank's ZeRO shard.
  torch::optim::AdamW& optimizer();

  ViT model_{nullptr};
  std::unique_ptr<torch::optim::AdamW> optimizer_;     // without ZeRO
  std::unique_ptr<dist::ShardedOptimizer> zero_;       // with ZeRO
  std::unique_ptr<dist::GradSync> sync_;               // when running as one of several ranks
  int rank_ = 0;
  int world_size_ = 1;
  OptimizerOptions optimizer_options_;
  KdLossOptions loss_options_;
  double clip_grad_norm_;
  bool skip_nonfinite_;
  int intraop_threads_;
  bool bf16_;
  std::uint64_t configured_total_steps_;
  std::string checkpoint_dir_;
  std::unique_ptr<FolderLock> lock_;  // this run's claim on checkpoint_dir_
  std::uint64_t checkpoint_every_;
  std::uint64_t keep_checkpoints_;
  std::uint64_t snapshot_every_;

  TrainState state_;
  bool resumed_ = false;
  std::uint64_t steps_this_run_ = 0;
  // Per-step time split, summed over this run.
  // data_wait: from the end of one step to the start of the next (the input was not ready).
  double forward_s_ = 0, backward_s_ = 0, sync_s_ = 0, optimizer_s_ = 0, checkpoint_s_ = 0;
  double data_wait_s_ = 0;
  std::chrono::steady_clock::time_point last_step_end_, run_begin_;
  std::vector<StepRecord> history_;
  std::ofstream step_log_;
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
