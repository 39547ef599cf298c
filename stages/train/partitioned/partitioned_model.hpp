#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "distributed/torch_compat.hpp"
#include "graph/stage.hpp"
#include "stages/data/batch.hpp"
#include "stages/train/models/kd_loss.hpp"
#include "stages/train/models/vit.hpp"
#include "stages/train/partitioned/batch_runner.hpp"
#include "stages/train/partitioned/schedule.hpp"

namespace flowtrain::dist {
class PartitionLink;
class World;
}  // namespace flowtrain::dist

namespace flowtrain::train {

struct Checkpoint;

/// Pipeline model parallelism (a ViT only): the model split into partitions, each run by a
/// thread of its own on `threads` intra-op threads (in one process) or by a rank of the job
/// (across processes, partitions = ranks), and each batch into micro-batches that flow through
/// them as `schedule` orders (batch_runner.hpp).
struct PartitionOptions {
  int partitions = 1;            // model ranks (threads); 1 with 1 micro-batch: not partitioned
  int chunks_per_partition = 1;  // model chunks per partition (schedule kInterleaved)
  std::vector<int> splits;       // block indices where chunks begin (empty: balanced)
  /// With no splits given: balance the chunks by each block's measured cost (piece_seconds;
  /// across ranks, rank 0's measurement; resumed, the checkpoint's splits) instead of by their
  /// count.
  bool measured_balance = false;
  int microbatches = 1;
  PartitionScheduleKind schedule = PartitionScheduleKind::k1F1B;
  int threads = 1;  // intra-op threads of each partition

  bool enabled() const { return partitions > 1 || microbatches > 1; }
};

/// A ViT cut into model stages that partitions run, and the steps through them: Trainer's
/// forward and backward when its model is partitioned. The partitions are threads of this
/// process, or ranks of the job (one partition each, and with more ranks than partitions, the
/// pipelines side by side are data-parallel). A step opens with begin(), each partition runs
/// its actions (run(): all of this process's, each on a thread of its own; or run_partition(p)
/// from a graph node each), and end() waits for them and says what the step did.
///
///   PartitionedModel model(options, vit, autocast, seed, loss, world, resume_from);
///   model.begin(batch, labels, /*as_tasks=*/false);
///   model.run();
///   const PartitionedModel::Step step = model.end();   // the gradients are in vit's grads
class PartitionedModel {
 public:
  /// A micro-batch's loss from the last model stage's output and that micro-batch's teacher
  /// outputs, labels and targets; writes its terms to `loss` and returns the float logits used.
  using LossFn = std::function<torch::Tensor(const ModelOutput& forward,
                                             const torch::Tensor& teacher_logits,
                                             const torch::Tensor& labels,
                                             const torch::Tensor& targets,
                                             KdLoss& loss)>;

  /// Splits `vit` (where options.splits say, else the checkpoint's or measured ones with
  /// measured_balance, else as equal a count of blocks as they divide). With a `world` of more
  /// than one rank, each rank runs one partition. Throws Error for settings that cannot
  /// partition (dropout, partitions that do not divide the ranks).
  PartitionedModel(const PartitionOptions& options,
                   ViT vit,
                   c10::ScalarType autocast,
                   std::uint64_t seed,
                   bool zero,
                   LossFn loss,
                   dist::World* world,
                   const Checkpoint* resume_from);
  ~PartitionedModel();
  PartitionedModel(const PartitionedModel&) = delete;
  PartitionedModel& operator=(const PartitionedModel&) = delete;

  const PartitionSchedule& schedule() const { return schedule_; }
  /// Block indices where the model's chunks begin (a checkpoint records them).
  const std::vector<int>& splits() const { return splits_; }
  /// [parameter] (named_parameters() order): the partition holding it.
  std::vector<int> parameter_partitions() const;
  /// Across ranks: this process's partition, its pipeline's ranks and, with pipelines side by
  /// side, the ranks holding the same partition in the others (else nullptr).
  bool across_ranks() const { return link_ != nullptr; }
  int partition() const;
  dist::Group* partition_group() const { return group_; }
  dist::Group* replicas() const { return replicas_; }
  /// Whether this process computes the loss: it holds the last model stage.
  bool holds_loss() const;

  /// Opens a step on `batch` with label targets `labels`: its micro-batches and the
  /// PartitionedBatch the partitions run. `as_tasks`: the partitions run as graph nodes
  /// (suspending oneTBB tasks when they wait), else on threads of their own (run()). Throws
  /// Error if the batch has fewer samples than micro-batches.
  void begin(const data::Batch& batch, const torch::Tensor& labels, bool as_tasks);
  /// Runs every partition of this process, each on a thread of its own, until the step is done.
  void run();
  /// Partition p's part of the step; throws Error naming the partition, the model stage and
  /// the micro-batch if one of its actions fails (a partition stopped by another's failure
  /// returns).
  void run_partition(int partition);
  /// Stops the step in flight (and any step begun after): partitions waiting return, and
  /// end() throws `reason` (the run failed elsewhere).
  void cancel(const std::string& reason);
  /// Seconds partition p waited for the other partitions' tensors, summed over the steps.
  double wait_seconds(int partition) const;

  /// What one step did: across ranks, every rank learns the loss and accuracy from the rank
  /// holding the last stage, and the bubble counts every partition.
  struct Step {
    double loss = 0;
    KdLoss terms;  // the batch's loss terms: weighted sums of the micro-batches'
    std::uint64_t correct = 0;
    double bubble = 0;
    int peak_in_flight = 0;
    std::int64_t peak_bytes = 0;
    std::vector<TimelineSpan> timeline;  // each action, on track "partition P"
  };
  /// Waits for every partition of this process and ends the step. Throws the first failure.
  Step end();

 private:
  /// Every rank gathers what the others know of the step: the loss, the accuracy, and when
  /// each rank's actions ran.
  void exchange(bool has_loss,
                std::vector<std::vector<std::pair<double, double>>>& spans,
                Step& step);

  PartitionOptions options_;
  ViT vit_;
  dist::World* world_;
  PartitionSchedule schedule_;
  std::vector<ModelStageFn> stages_;
  std::vector<int> splits_;
  std::vector<int> param_stages_;  // [parameter]: the model stage it belongs to
  // Across processes: this rank runs its partition, its tensors travel through the link to
  // the other ranks of its pipeline (`group_`); with data parallelism too, `replicas_` are the
  // ranks holding the same partition in the other pipelines.
  std::unique_ptr<dist::PartitionLink> link_;
  dist::Group* group_ = nullptr;
  dist::Group* replicas_ = nullptr;
  // The step's micro-batches, their loss weights (n_m / B), and what the last partition's loss
  // left of each; the batch's labels, to count its right predictions.
  std::vector<torch::Tensor> images_, teacher_logits_, labels_, targets_, logits_;
  std::vector<double> weights_;
  std::vector<KdLoss> losses_;
  torch::Tensor batch_labels_;
  struct Running;  // the step in flight, guarded against cancel()
  std::unique_ptr<Running> running_;
  std::vector<double> waited_s_;  // [partition]: over the finished steps
};

}  // namespace flowtrain::train
