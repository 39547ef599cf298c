#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "graph/registry.hpp"
#include "stages/train/models/compute.hpp"
#include "stages/train/step/training_session.hpp"

namespace flowtrain::train {

struct TrainPartitionOptions {
  int partition = 1;
  int partitions = 2;
  int microbatches = 1;
  int intraop_threads = 1;
  template <class Declare>
  void declare(Declare& d) {
    d(partition, "partition", "the model partition this node runs (1 .. partitions - 1; the "
      "entry runs 0)", {.min = 1, .max = 255});
    d(partitions, "partitions", "the entry's partitions", {.min = 2, .max = 256});
    d(microbatches, "microbatches", "the entry's micro-batches per batch", {.min = 1, .max = 4096});
    declare_intraop_threads(d, intraop_threads);
  }
};

/// A partition of a training step's model after the first, in one process: a `train_step`
/// entry with `partitions` P > 1 brings `<name>/partition1` .. `<name>/partition<P-1>`, the
/// entry running partition 0. Each gets the step (a GradBucket, from the entry or the partition
/// before) and runs its partition's forwards and backwards of the step's micro-batches in the
/// order its schedule gives (PartitionedModel::run_partition), on its own intraop_threads; a node
/// that is not the last hands the step on first, so that every partition works at once. Activations
/// go forward and their gradients back between the partitions in memory; a partition waiting
/// for one suspends its task (oneTBB's resumable tasks), so its graph thread runs other stages
/// meanwhile. The last partition's node then waits for the others and ends the step
/// (Trainer::end_partitions), emitting its gradient buckets to `<name>/grad_sync`.
///
/// Its results: `waited_ms` per step (its share of the pipeline's bubble: waiting for the
/// others' tensors); its busy time includes that wait.
class TrainPartitionStage final : public FlatMap<GradBucket, GradBucket> {
 public:
  using Options = TrainPartitionOptions;
  explicit TrainPartitionStage(const Options& options);
  static StageDoc describe();

  std::size_t threads_per_invocation() const override {
    return static_cast<std::size_t>(options_.intraop_threads);
  }
  bool intra_op_parallel() const override { return true; }
  std::vector<StageResult> results() const override;
  StageWait waiting() const override;
  void cancel() override;

 protected:
  void process(GradBucket&& bucket, Emitter<GradBucket>& out) override;

 private:
  Options options_;
  std::shared_ptr<TrainingSession> session_;           // from the first step
  std::atomic<TrainingSession*> published_{nullptr};  // session_, for cancel() and results()
};

/// The wait of partition `partition` of `session`'s trainer, as a partition's node reports it.
StageWait partition_wait(const TrainingSession& session, int partition, int microbatches);

}  // namespace flowtrain::train
