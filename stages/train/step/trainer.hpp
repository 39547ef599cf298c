#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "distributed/torch_compat.hpp"
#include "graph/stage.hpp"
#include "stages/data/batch.hpp"
#include "stages/train/files/checkpoint.hpp"
#include "stages/train/files/weights.hpp"
#include "stages/train/models/kd_loss.hpp"
#include "stages/train/models/model.hpp"
#include "stages/train/models/vit.hpp"
#include "stages/train/partitioned/partitioned_model.hpp"
#include "stages/train/step/grad_scaler.hpp"
#include "stages/train/step/optimizer.hpp"
#include "stages/train/step/weight_average.hpp"
#include "stages/train/step/work_clock.hpp"

namespace flowtrain::dist {
class GradSync;
class ShardedOptimizer;
struct ShardingPlan;
class World;
}  // namespace flowtrain::dist

namespace flowtrain::train {

/// What a Trainer trains, and how.
struct TrainerOptions {
  ModelConfig model;
  std::uint64_t seed = 0;  // the initial weights and every random draw of training follow it
  OptimizerOptions optimizer;
  KdLossOptions loss;
  double clip_grad_norm = 1.0;   // 0: off
  bool skip_nonfinite = false;   // a NaN/infinite loss or gradient: skip the update (else throw)
  /// Autocast the forward to bfloat16 or float16 (float16 on a GPU, with loss scaling:
  /// GradScaler); float32: off.
  c10::ScalarType autocast = c10::kFloat;
  /// Where the model, its optimizer state, its gradients and buckets, and the loss live; a
  /// batch elsewhere is copied there. A partitioned model runs on the CPU only.
  c10::Device device = c10::Device(c10::DeviceType::CPU);
  /// With float16 autocast: the loss scaler's settings.
  GradScalerOptions loss_scale;
  /// > 0: also keep an exponential moving average of the weights with this decay
  /// (WeightAverage), which checkpoints carry and inference loads.
  double ema_decay = 0;
  /// A PyTorch state_dict or safetensors file whose weights replace the initial ones, after the
  /// model is built and before the optimizer, the average and the ranks' broadcast see it
  /// (init_weights). A resumed trainer takes its checkpoint's weights instead. Empty: none.
  WeightsInit init;
  // With a process group (data parallelism):
  // ZeRO stage: 1 shards the optimizer state across the ranks, 2 the gradients too; 0 neither.
  int zero = 0;
  std::int64_t first_bucket_bytes = 1'000'000;  // first gradient bucket to all-reduce
  std::int64_t bucket_bytes = 25'000'000;       // the other buckets
  /// A partitioned model: with one process, partitions are threads of it; with a world, one
  /// partition per rank.
  PartitionOptions partitioned;
};

/// One training step, as measured. `sync_end` is when the optimizer could start: every
/// gradient bucket averaged (with one process, when backward ended).
struct StepOutcome {
  bool applied = false;       // false: skipped for a non-finite loss or gradient
  double loss = 0;
  double lr = 0;              // the step's learning rate (0 when skipped)
  std::uint64_t correct = 0;  // training predictions that matched the label
  std::uint64_t seen = 0;     // samples in the batch
  std::uint64_t batch_number = 0;  // Batch::number of its batch
  // Partitioned: the share of partition-time idle in this step, the most micro-batches
  // whose activations a partition kept at once, and the most memory a partition of this
  // process held at once (PartitionedBatchResult::peak_bytes).
  double bubble = 0;
  int peak_in_flight = 0;
  std::int64_t peak_bytes = 0;
  /// Partitioned: each action this process ran ("F3" on track "partition 0"), its times on
  /// steady_clock (item unset: the step is numbered when applied).
  std::vector<TimelineSpan> timeline;
  std::chrono::steady_clock::time_point begin, forward_end, backward_end, sync_end, end;
};

/// The training math of a ViT, with no graph around it: the model, the loss (distillation
/// from the batch's teacher outputs, else supervised), AdamW with warm-up + cosine (or its
/// ZeRO shard), gradient clipping and, given a process group, the gradient all-reduce, which
/// backward hooks start bucket by bucket so it overlaps backward. Tests drive it directly:
///
///   Trainer trainer({.model = model_config("vit_cpu_student", 112, 10), .seed = 1});
///   trainer.set_total_steps(100);
///   StepOutcome out = trainer.step(batch);   // forward, loss, backward, sync, clip, AdamW
///   std::string bytes = trainer.checkpoint(/*with_optimizer=*/true);
///
/// A step is also three calls, which the graph runs as three nodes (train_step, grad_sync,
/// optimizer_step): `forward_backward(batch)` returns the number of gradient buckets, each
/// `sync_bucket(b)` averages one (concurrently, in any order), and `apply()` clips and steps.
/// Steps run in the order they are called, each on the weights the previous one left; one step
/// is in flight at a time.
class Trainer {
 public:
  /// `world`: the data-parallel job (its process group), or nullptr for one process.
  /// `resume_from`: a checkpoint to continue from (its weights, optimizer state, RNG and state),
  /// checked against this job's ranks and ZeRO setting. With a world, every rank then starts
  /// from rank 0's weights.
  explicit Trainer(const TrainerOptions& options,
                   dist::World* world = nullptr,
                   const Checkpoint* resume_from = nullptr);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  /// The learning-rate schedule's length (a resumed trainer keeps its checkpoint's).
  void set_total_steps(std::uint64_t steps) { state_.total_steps = steps; }

  /// One step on `batch`. Throws Error naming the step and batch if the loss or gradient is not
  /// finite (unless skip_nonfinite), or if the batch has no teacher outputs and alpha < 1.
  StepOutcome step(const data::Batch& batch);

  /// The first part of a step: forward, loss and backward (with a group, each gradient bucket's
  /// all-reduce starts as it fills). Returns the buckets sync_bucket must complete: the
  /// group's buckets, or 1 without a group.
  std::size_t forward_backward(const data::Batch& batch);
  /// forward_backward with the model's partitions as nodes of a graph (stages/train/
  /// partitioned/partition_node.hpp): begin_partitions opens the step; each partition p then
  /// runs its actions in a oneTBB task of its own, partitioned()->run_partition(p), all at once,
  /// a partition waiting for another's activation or gradient suspending its task; and one of
  /// them ends the step, end_partitions, which waits for the others and returns the buckets
  /// sync_bucket must complete. The same weights as forward_backward, bit for bit.
  void begin_partitions(const data::Batch& batch);
  std::size_t end_partitions();
  /// The partitioned model (options.partitioned), or nullptr.
  PartitionedModel* partitioned() const { return partitioned_.get(); }
  /// Waits for bucket b's all-reduce and writes its averaged gradients back (nothing without a
  /// group). Thread-safe for different buckets of the step.
  void sync_bucket(std::size_t b);
  /// The last part: clips the gradient, checks it and the loss are finite, and steps the
  /// optimizer at the scheduled learning rate. Errors as step().
  StepOutcome apply();

  /// A checkpoint file's bytes: the model, its shape, the state, the RNG and (with_optimizer)
  /// this rank's optimizer state. Written to disk with write_file_atomically.
  std::string checkpoint(bool with_optimizer) const;

  const TrainState& state() const { return state_; }
  const TrainerOptions& options() const { return options_; }
  ImageModel& model() { return model_; }
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  bool resumed() const { return resumed_ranks_ > 0; }
  /// The ranks that wrote the checkpoint it resumed (0: not resumed).
  std::uint64_t resumed_ranks() const { return resumed_ranks_; }
  /// Resumed from a checkpoint another number of ranks wrote.
  bool resized() const {
    return resumed() && resumed_ranks_ != static_cast<std::uint64_t>(world_size_);
  }
  /// What `init` loaded; nullopt without init, or when resumed.
  const std::optional<InitCounts>& init_counts() const { return init_counts_; }
  /// The gradient buckets of a step (forward_backward's count): the group's, or 1.
  std::size_t buckets_per_step() const;
  /// The ranks agreed to stop after the last step applied (a signal on any of them,
  /// dist::GradSync::stop_agreed): a batch still in flight is passed over, on every rank.
  bool stopping() const;
  /// With a group: all-reduce time summed over the steps, first bucket's start to last's end.
  double sync_comm_seconds() const;
  /// Bytes of optimizer state this rank holds.
  std::int64_t optimizer_state_bytes() const;
  /// Bytes of gradients this rank holds between steps (with a group, its buckets' buffers too).
  std::int64_t gradient_bytes() const;

 private:
  // The constructor's steps, in order: the options, the model (seeded, `init` loaded), the
  // partitions (pipeline parallelism), the optimizer and who holds which state (ZeRO), the
  // resume, and the gradient sync of a group.
  void check_options() const;
  void build_model(const Checkpoint* resume_from);
  void build_partitions(dist::World* world, const Checkpoint* resume_from);
  /// The sharding plan; what the gradient sync still needs of it stays in it.
  dist::ShardingPlan build_optimizer(dist::World* world);
  /// Restores the weights, optimizer state, average and loss scale of `from`; true if it held
  /// an average. `shards` and `partition_ranks` are this run's, as the checkpoint records them.
  bool resume(const Checkpoint& from, std::uint64_t shards, std::uint64_t partition_ranks);
  void start_grad_sync(dist::World& world, dist::ShardingPlan& plan);

  torch::optim::AdamW& optimizer() const;
  /// The loss of `forward` against the batch's (or a micro-batch's) targets; `labels` may be
  /// mixed (one-hot shares). Returns the float logits it used.
  torch::Tensor loss_of(const ModelOutput& forward,
                        const torch::Tensor& teacher_logits,
                        const torch::Tensor& labels,
                        const torch::Tensor& targets,
                        KdLoss& loss) const;

  TrainerOptions options_;
  ImageModel model_{nullptr};
  std::unique_ptr<torch::optim::AdamW> optimizer_;  // without ZeRO
  std::unique_ptr<dist::ShardedOptimizer> zero_;    // with ZeRO
  std::unique_ptr<dist::GradSync> sync_;            // with a group
  std::unique_ptr<WeightAverage> average_;          // with ema_decay
  std::unique_ptr<GradScaler> scaler_;              // with float16 autocast
  // When a step's parts ended on the device (CUDA events on a GPU): marks of StepOutcome.
  std::unique_ptr<WorkClock> clock_;
  enum Mark { kForwardEnd, kBackwardEnd, kSyncEnd, kEnd };
  /// Ends a step: its last mark, and the times of all marks in `out`.
  StepOutcome& finish(StepOutcome& out);
  dist::World* world_ = nullptr;
  // Gradients sharded (ZeRO-2, partitions on ranks): per parameter, whether this rank holds
  // its gradient after the sync; within grad_group_ each gradient is held by one rank. Empty:
  // every rank holds every gradient.
  std::vector<bool> grad_held_;
  dist::Group* grad_group_ = nullptr;
  int rank_ = 0;
  int world_size_ = 1;
  TrainState state_;
  std::uint64_t resumed_ranks_ = 0;  // that wrote the checkpoint it resumed; 0: not resumed
  std::optional<InitCounts> init_counts_;

  // The step between forward_backward and apply.
  struct Pending {
    StepOutcome out;
    KdLoss loss;
    std::uint64_t end_position = 0;
    std::optional<std::uint64_t> end_shared_position;
    std::optional<std::uint32_t> epoch;  // of the batch's last view, when it has views
  };
  std::optional<Pending> pending_;

  /// The start of a step, either way: checks the batch, opens pending_, and returns the label
  /// targets (a mixed row's: the shares of its two labels).
  torch::Tensor begin_step(const data::Batch& batch);
  /// The end of forward_backward, either way: backward done, the buckets the sync must complete.
  std::size_t end_step();

  std::unique_ptr<PartitionedModel> partitioned_;
  /// The start and end of a partitioned step, either way (its partitions as graph nodes, or
  /// on threads of their own): the micro-batches, then what the partitions did, into the step.
  void begin_partitioned_step(const data::Batch& batch, bool as_tasks);
  std::size_t end_partitioned_step();
  /// With sharded gradients: clips the gradient by its norm over every rank's share (the norm
  /// clip_grad_norm_ takes of the whole model's, bit for bit) and returns that norm.
  double clip_sharded_gradients(double max_norm);
};

}  // namespace flowtrain::train
