#include "stages/train/step/grad_sync_stage.hpp"

namespace flowtrain::train {

StageDoc GradSyncStage::describe() {
  return {
      "Averages each gradient bucket of a training step over the data-parallel ranks: waits "
      "for the all-reduce its backward hook started and writes the gradients back (with one "
      "process it passes the step on). Brought by a `train_step` entry as "
      "`<name>/grad_sync`; its concurrency is the buckets in flight.",
      {}};
}

std::optional<GradBucket> GradSyncStage::process(GradBucket&& bucket, ItemContext&) {
  if (bucket.count > 0) bucket.session->trainer->sync_bucket(bucket.index);
  return std::move(bucket);
}

FLOWTRAIN_REGISTER_STAGE("grad_sync", GradSyncStage);

}  // namespace flowtrain::train
