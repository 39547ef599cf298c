#pragma once

#include <cstdint>
#include <memory>

#include "graph/registry.hpp"
#include "stages/train/models/compute.hpp"
#include "stages/train/step/training_session.hpp"

namespace flowtrain::train {

struct OptimizerStepOptions {
  int intraop_threads = 1;
  std::uint64_t checkpoint_every = 0;
  std::uint64_t snapshot_every = 0;
  bool final_checkpoint = false;
  template <class Declare>
  void declare(Declare& d) {
    declare_intraop_threads(d, intraop_threads);
    d(checkpoint_every, "checkpoint_every", "take a checkpoint every N steps (0: none)",
      {.min = 0});
    d(snapshot_every, "snapshot_every", "take a snapshot (the model alone) every N steps",
      {.min = 0});
    d(final_checkpoint, "final_checkpoint",
      "take a checkpoint at the end: final.pt, or a resumable step file after a stop");
  }
};

/// The end of a training step: once every gradient bucket of step t has come (in order), clips
/// the gradient, steps AdamW (or its ZeRO shard, then broadcasts), takes the bytes of a
/// checkpoint or snapshot when one is due, emits the step's StepRecord for the writers, and
/// sends a token back to `train_step`, whose forward t+1 waits for it (StageOptions::
/// token_from). At the end, with final_checkpoint, emits the final checkpoint's record. A
/// `train_step` entry brings it as `<name>/optimizer_step`, with these params set from its own.
class OptimizerStepStage final : public FlatMap<GradBucket, StepRecord> {
 public:
  using Options = OptimizerStepOptions;
  explicit OptimizerStepStage(const Options& options);
  static StageDoc describe();

  bool requires_order() const override { return true; }
  std::size_t threads_per_invocation() const override { return intraop_threads_; }
  bool intra_op_parallel() const override { return true; }

 protected:
  void process(GradBucket&& bucket, Emitter<StepRecord>& out) override;
  void finish(Emitter<StepRecord>& out) override;

 private:
  void apply(TrainingSession& session, Emitter<StepRecord>& out);

  int intraop_threads_;
  std::uint64_t checkpoint_every_;
  std::uint64_t snapshot_every_;
  bool final_checkpoint_;
  std::shared_ptr<TrainingSession> session_;  // of the buckets it receives
  std::size_t next_bucket_ = 0;               // of the step in flight
};

}  // namespace flowtrain::train
