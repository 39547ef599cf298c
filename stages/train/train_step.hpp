#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "graph/registry.hpp"
#include "stages/data/batch.hpp"
#include "stages/train/folder_lock.hpp"
#include "stages/train/training_session.hpp"

namespace flowtrain::train {

/// The training step's first node: forward, loss (distillation when the batch carries teacher
/// outputs, else supervised) and backward, through a Trainer; with data parallelism backward's
/// hooks start each gradient bucket's all-reduce as it fills. It emits the step's gradient
/// buckets (one with a single process), which `grad_sync` averages and `optimizer_step` applies
/// (clip, AdamW with warm-up + cosine); forward t+1 waits for update t's token, while the data
/// and teacher stages work ahead on later batches: the loop is exact whatever their
/// concurrency. A non-finite loss or gradient stops the run with an error naming the step, or
/// (on_nonfinite: skip) skips the update and counts it.
///
/// A config entry brings the rest of the step as nodes (expand): `<name>/grad_sync` and
/// `<name>/optimizer_step`, wired with the token edge, and, when no entry takes the step's
/// records, `<name>/step_log`, `<name>/checkpoint` and `<name>/snapshot`, which write them. The
/// entry's row reports the whole step's numbers. With resume: true the newest checkpoint in
/// checkpoint_dir is restored and the run continues exactly where it stopped. (`student_step`
/// is its former name, still accepted.)
class TrainStepStage final : public FlatMap<data::Batch, GradBucket> {
 public:
  explicit TrainStepStage(const Params& params);
  ~TrainStepStage() override;
  static StageDoc describe();
  static std::vector<ExpandedNode> expand(const Params& params);

  bool requires_order() const override { return true; }
  std::size_t threads_per_invocation() const override { return session_->intraop_threads; }
  bool intra_op_parallel() const override { return true; }
  /// The buckets of each batch.
  std::optional<std::uint64_t> plan(std::optional<std::uint64_t> batches) override;
  std::optional<std::uint64_t> resume_position() const override;
  std::vector<StageResult> results() const override;
  /// step, total_steps, epoch (1-based), loss (smoothed over recent steps), images.
  std::vector<StageResult> live_results() const override;

  const std::vector<StepRecord>& history() const { return session_->history; }
  const TrainState& state() const { return session_->trainer->state(); }
  ViT& model() { return session_->trainer->model(); }

 protected:
  void process(data::Batch&& batch, Emitter<GradBucket>& out) override;

 private:
  std::shared_ptr<TrainingSession> session_;
  std::unique_ptr<FolderLock> lock_;  // this run's claim on checkpoint_dir
  std::uint64_t configured_total_steps_;
};

/// The ViT a training stage builds from its params: a preset (model, image_size, classes,
/// regression_outputs) with optional overrides of its shape (patch_size, dim, depth, heads,
/// dropout; 0 keeps the preset's).
std::vector<ParamSpec> vit_param_specs();
ViTConfig vit_config_from(const Params& params);

}  // namespace flowtrain::train
