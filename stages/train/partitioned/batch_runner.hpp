#pragma once

#include <torch/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "distributed/partition_link.hpp"
#include "stages/train/models/vit.hpp"
#include "stages/train/partitioned/schedule.hpp"

namespace flowtrain::train {

using dist::PartitionTransport;

/// One pipeline stage of a partitioned model: from its input (the images for the first
/// stage, the previous stage's output otherwise) to its output; the last stage's output is the
/// micro-batch's loss, a scalar averaged over its samples.
using ModelStageFn = std::function<torch::Tensor(const torch::Tensor& input, int microbatch)>;

/// What one batch through a pipeline did, as measured.
struct PartitionedBatchResult {
  /// [microbatch]: each micro-batch's loss (before the 1/M scale); with a transport, only on
  /// the rank holding the last stage (0 elsewhere).
  std::vector<double> losses;
  double loss = 0;  // their weighted sum: the batch's loss
  double wall_s = 0;
  std::chrono::steady_clock::time_point start;  // of the batch: `spans` count from it
  /// Each rank's actions as they ran: start (once the input had arrived) and end in seconds
  /// from the batch's start ([rank][i], in schedule order), for the pipeline chart; with a
  /// transport, this process's rank's only (the others' are empty).
  std::vector<std::vector<std::pair<double, double>>> spans;
  double bubble = 0;                // 1 - busy / (ranks x wall): the ranks' idle share (here)
  std::vector<int> peak_in_flight;  // [stage]: most micro-batches whose activations it kept
  /// [rank]: the most CPU tensor memory its thread's allocations held at once during the batch,
  /// above what they held at its start (the activations kept for backward, and transient
  /// workspace); with a transport, this process's rank's only (the others' 0).
  std::vector<std::int64_t> peak_bytes;
};

/// One batch through a pipeline while it runs: the forward and backward of each micro-batch
/// through `stages` as `schedule` orders them. Each rank of the schedule runs its actions in
/// order through run_rank, on `intraop_threads` ATen threads, and activations and their
/// gradients go between ranks in memory (or, with a `transport`, to and from ranks in other
/// processes). A stage keeps a micro-batch's activations from its forward to its backward only.
/// Each micro-batch's loss is scaled by 1/M before its backward, so the gradients accumulated in
/// the parameters' `grad` are those of the mean loss over the batch (with micro-batches of equal
/// size), as torch.distributed.pipelining computes them; the caller then steps its optimizer
/// once. `input(m)` gives micro-batch m's input to the first stage; `weights[m]` (default 1/M)
/// scales its loss instead of 1/M, n_m / B for micro-batches of unequal sizes n_m (the loss is
/// then the batch's mean whatever the split).
///
/// The ranks of this process run either on threads of their own (run(): one each) or as tasks
/// of a oneTBB arena, one rank per graph node (a train_step's partitions): with
/// `Wait::kSuspend` a rank waiting for another's tensor suspends its task (oneTBB's resumable
/// tasks), so the thread runs other work (the data stages) meanwhile instead of blocking.
///
///   PartitionedBatch batch(schedule, stages, input_of, 1, {}, nullptr,
///   PartitionedBatch::Wait::kSuspend);
///   // each rank r, in a task of its own: batch.run_rank(r);
///   batch.wait_ranks();                        // in any of them
///   const PartitionedBatchResult r = batch.finish();
class PartitionedBatch {
 public:
  /// How a rank waits for a tensor another rank of this process has yet to hand it: blocking
  /// its thread, or suspending its oneTBB task (run_rank must then run in one).
  enum class Wait { kBlock, kSuspend };

  /// Throws Error if `stages` or `weights` do not fit `schedule`, or the transport's rank is
  /// not one of its ranks.
  PartitionedBatch(const PartitionSchedule& schedule,
                const std::vector<ModelStageFn>& stages,
                std::function<torch::Tensor(int)> input,
                int intraop_threads = 1,
                std::vector<double> weights = {},
                PartitionTransport* transport = nullptr,
                Wait wait = Wait::kBlock);
  ~PartitionedBatch();
  PartitionedBatch(const PartitionedBatch&) = delete;
  PartitionedBatch& operator=(const PartitionedBatch&) = delete;

  /// Runs rank `rank`'s actions in order, each once its input has arrived. If one fails,
  /// every rank of this process stops and this throws Error naming the rank, the stage, the
  /// micro-batch and the reason; a rank stopped so by another one's failure returns.
  void run_rank(int rank);
  /// Runs every rank of this process (the transport's, or all of them), each on a thread of
  /// its own, and returns once all are done (Wait::kBlock).
  void run();
  /// Waits until every rank of this process has returned from run_rank.
  void wait_ranks();
  /// Stops the ranks: those waiting for a tensor return, and finish() throws `reason`. For a
  /// run failing elsewhere, so that no rank waits for one that will never run.
  void cancel(const std::string& reason);
  /// Seconds rank `rank` has waited for its inputs from ranks of this process so far.
  double waited_seconds(int rank) const;
  /// Once every rank of this process is done: what the batch did. Throws the first failure.
  PartitionedBatchResult finish();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

/// Runs one batch through a pipeline in one call: every rank of this process on a thread of its
/// own (PartitionedBatch::run), then PartitionedBatch::finish. With a `transport`, this process
/// runs only the actions of its rank, and the tensors to and from the other ranks' stages go
/// through it (every rank calls this with the same schedule).
///
///   const PartitionSchedule schedule = make_partition_schedule(PartitionScheduleKind::k1F1B, 2,
///   4); const std::vector<ModelStageFn> stages = vit_model_stages(model, {2}, loss_of); const
///   PartitionedBatchResult r = run_partitioned_batch(schedule, stages, input_of, 1);
///   optimizer.step();
PartitionedBatchResult run_partitioned_batch(const PartitionSchedule& schedule,
                                       const std::vector<ModelStageFn>& stages,
                                       const std::function<torch::Tensor(int)>& input,
                                       int intraop_threads = 1,
                                       const std::vector<double>& weights = {},
                                       PartitionTransport* transport = nullptr);

/// A ViT split into pipeline stages at block indices `splits` (ascending, within 1 .. depth -
/// 1): the first stage embeds the images and runs the blocks before splits[0], the next ones
/// the blocks up to each next split, the last the rest, the head and `loss(output, m)`.
///   vit_model_stages(model, {2}, loss)   // depth 4: [embed, blocks 0-1], [blocks 2-3, head]
std::vector<ModelStageFn> vit_model_stages(
    ViT& model,
    const std::vector<int>& splits,
    std::function<torch::Tensor(const ModelOutput&, int)> loss);

/// The block indices a `partition_splits` param gives (whole numbers >= 1, else Error naming it).
std::vector<int> split_points_param(const std::vector<double>& values);

/// Where each chunk of a model of `blocks` blocks split at `splits` begins and ends:
/// {0, splits..., blocks}, chunk i being blocks [bounds[i], bounds[i + 1]). Throws Error unless
/// the splits rise within 1 .. blocks - 1.
///   chunk_bounds(12, {4, 8}) == {0, 4, 8, 12}
std::vector<int> chunk_bounds(int blocks, const std::vector<int>& splits);

/// The pipeline stage each of the model's parameters (named_parameters() order) belongs to when
/// split at `splits` as vit_model_stages does: the embedding's to the first, block i's to
/// the stage running it, the final norm's and the heads' to the last.
std::vector<int> vit_parameter_stages(ViT& model, const std::vector<int>& splits);

/// Split points that give `stages` stages of a model of `depth` blocks (a ViT's, a ResNet's) as
/// equal a share of the blocks as they divide: {2} for depth 4 and 2 stages, {4, 8} for depth
/// 12 and 3.
std::vector<int> balanced_splits(int depth, int stages);

/// What each piece of a model costs, measured: the forward (and with `backward`, the backward)
/// seconds on `images`, under the caller's autocast (and no-grad guard, for a forward alone), of
/// [0] the embedding, [1 + i] block i and [blocks() + 1] the head (ImageModelImpl); each the
/// median of `reps` after a warm-up. The gradients it leaves in the parameters are the
/// caller's to zero.
std::vector<double> piece_seconds(ImageModelImpl& model,
                                  const torch::Tensor& images,
                                  bool backward,
                                  int reps = 3);

/// Split points that give `stages` stages of a model whose pieces cost `costs` (as
/// piece_seconds orders them) the smallest largest stage cost, the embedding's counted with
/// the first block and the heads' with the last; among equal choices, the earliest splits.
///   measured_splits({0.5, 1, 1, 1, 1, 2.5}, 2) == {3}   // [embed, 3 blocks], [1 block, heads]
std::vector<int> measured_splits(const std::vector<double>& costs, int stages);

}  // namespace flowtrain::train
