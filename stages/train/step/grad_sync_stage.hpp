#pragma once

#include "graph/registry.hpp"
#include "stages/train/step/training_session.hpp"

namespace flowtrain::train {

/// Averages one gradient bucket over the data-parallel ranks: waits for the all-reduce that
/// backward's hook started when the bucket filled (so communication overlaps backward, as in
/// PyTorch's DDP) and writes the averaged gradients back. Its busy time is the communication
/// backward did not hide; concurrency is the buckets waited on at once. With one process it
/// passes the step on. A `train_step` entry brings it as `<name>/grad_sync`.
class GradSyncStage final : public Map<GradBucket, GradBucket> {
 public:
  using Options = NoOptions;
  explicit GradSyncStage(const Options& = {}) {}
  static StageDoc describe();

 protected:
  std::optional<GradBucket> process(GradBucket&& bucket, ItemContext& ctx) override;
};

}  // namespace flowtrain::train
