#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "graph/options.hpp"
#include "graph/registry.hpp"
#include "stages/data/batch.hpp"
#include "stages/train/files/folder_lock.hpp"
#include "stages/train/models/compute.hpp"
#include "stages/train/models/kd_loss.hpp"
#include "stages/train/partitioned/schedule.hpp"
#include "stages/train/step/optimizer.hpp"
#include "stages/train/step/training_session.hpp"

namespace flowtrain::train {

/// What a NaN or infinite loss or gradient does (param on_nonfinite).
enum class OnNonfinite { kFail, kSkip };
inline std::span<const EnumName<OnNonfinite>> enum_names(OnNonfinite) {
  static constexpr EnumName<OnNonfinite> names[] = {{OnNonfinite::kFail, "fail"},
                                                    {OnNonfinite::kSkip, "skip"}};
  return names;
}

/// The ZeRO level (param zero; the ZeRO paper's "stage"): what each rank of a data-parallel job
/// shards.
enum class ZeroLevel { kNone = 0, kOptimizerState = 1, kGradients = 2 };
inline std::span<const EnumName<ZeroLevel>> enum_names(ZeroLevel) {
  static constexpr EnumName<ZeroLevel> names[] = {{ZeroLevel::kNone, "0"},
                                                  {ZeroLevel::kOptimizerState, "1"},
                                                  {ZeroLevel::kGradients, "2"},
                                                  {ZeroLevel::kNone, "false"},
                                                  {ZeroLevel::kOptimizerState, "true"}};
  return names;
}

/// The model a training stage builds from its options: a preset (model, image_size, classes,
/// regression_outputs) with optional overrides of its shape (patch_size, dim, depth, heads,
/// stage_blocks, stem; 0 or empty keeps the preset's) and its regularisation, or a TorchScript
/// file (model: student.pt), which takes only image_size, classes and the regression params. A
/// group of TrainStepOptions, its keys flat in YAML.
struct ModelOptions {
  std::string model = "vit_cpu_student";
  int image_size = 112;
  int classes = 0;
  int regression_outputs = 0;
  double regression_scale = 1.0;
  int patch_size = 0;
  int dim = 0;
  int depth = 0;
  int heads = 0;
  std::vector<double> stage_blocks;
  std::string stem;
  double dropout = 0.0;
  double drop_path = 0.0;
  bool distillation_token = false;
  template <class Declare>
  void declare(Declare& d) {
    d(model, "model",
      "model preset (vit_*: a ViT; resnet*: a ResNet of basic blocks), or a TorchScript file "
      "made in PyTorch (torch.jit.script(model).save(path); its outputs: docs/models.md)",
      {.choices = model_presets(), .type = ParamType::kPath});
    d(image_size, "image_size", "input side in pixels (augment's size)", {.min = 1, .max = 8192});
    d(classes, "classes", "number of classes (required)", {.min = 0, .max = 1 << 20});
    d(regression_outputs, "regression_outputs", "size of the regression head (0: none)",
      {.min = 0, .max = 1 << 16});
    d(regression_scale, "regression_scale",
      "the regression head predicts target / scale, multiplied back in its output (so targets "
      "like 350 kcal train at order one; the loss is on that scale)",
      {.min = 1e-9});
    d(patch_size, "patch_size", "ViT: patch side (0: the preset's)", {.min = 0, .max = 1024});
    d(dim, "dim",
      "ViT: embedding width; ResNet: the first stage's width, doubled per stage (0: the preset's)",
      {.min = 0, .max = 1 << 16});
    d(depth, "depth", "ViT: number of blocks (0: the preset's)", {.min = 0, .max = 1024});
    d(heads, "heads", "ViT: attention heads (0: the preset's)", {.min = 0, .max = 1024});
    d(stage_blocks, "stage_blocks",
      "ResNet: basic blocks per stage, e.g. [2, 2, 2, 2] (empty: "
      "the preset's)",
      {.type = ParamType::kIntList});
    d(stem, "stem",
      "ResNet: imagenet (conv 7x7/2 + max pool: the image / 4) or compact (conv 3x3/2: the "
      "image / 2, for small inputs); empty: imagenet",
      {.choices = {"", "imagenet", "compact"}});
    d(dropout, "dropout", "dropout probability (ViT: in the blocks; ResNet: before the heads)",
      {.min = 0});
    d(drop_path, "drop_path",
      "ViT: stochastic depth, the last block's rate of dropping a residual branch (rising "
      "linearly from 0)",
      {.min = 0});
    d(distillation_token, "distillation_token",
      "ViT: DeiT's distillation token and head, trained against the teacher (see `distillation`); "
      "predictions average both heads");
  }

  /// The preset with the overrides, validated; throws Error if `classes` is not given.
  ModelConfig config() const;
};

/// Pipeline model parallelism (a ViT): `partitions` pieces of the model, each on intraop_threads
/// intra-op threads: in one process, nodes of the graph (the entry and `<name>/partition1` ..,
/// TrainPartitionStage), in a job one per rank (each run of `partitions` consecutive ranks a
/// pipeline, the pipelines data-parallel); each batch flows through them as `microbatches`
/// micro-batches in the order `partition_schedule` gives
/// (stages/train/partitioned/batch_runner.hpp). A group of TrainStepOptions, its keys flat in YAML.
struct PartitionStepOptions {
  int partitions = 1;
  int microbatches = 1;
  PartitionScheduleKind partition_schedule = PartitionScheduleKind::k1F1B;
  int chunks_per_partition = 1;
  std::vector<double> partition_splits;
  PartitionBalance partition_balance = PartitionBalance::kBlocks;

  /// The Trainer's pipeline: each partition on `intraop_threads`. Throws Error for settings
  /// that do not fit together.
  PartitionOptions config(int intraop_threads) const;
  /// True when the partitions run as nodes of the graph of a job of `ranks` ranks (partitions
  /// > 1 and one rank: in a job of several each rank runs one partition).
  bool partition_nodes(std::size_t ranks) const { return partitions > 1 && ranks <= 1; }

  template <class Declare>
  void declare(Declare& d) {
    d(partitions, "partitions",
      "pipeline parallelism: model partitions (1: none; a ViT only), each on intraop_threads; "
      "in one process the entry runs the first and brings the nodes <name>/partition1 .. for "
      "the others (the phase needs threads >= partitions), in a job one per rank, each run of "
      "partitions consecutive ranks a pipeline, the pipelines data-parallel (give the "
      "training source ranks_per_shard: partitions)",
      {.min = 1, .max = 256});
    d(microbatches, "microbatches",
      "pipeline parallelism: micro-batches per batch (the loss is still the batch's mean)",
      {.min = 1, .max = 4096});
    d(partition_schedule, "partition_schedule",
      "pipeline parallelism: gpipe (all forwards, then all backwards), 1f1b (at most "
      "partitions micro-batches in flight) or interleaved (chunks_per_partition chunks per "
      "partition)",
      {.former_name = "pipeline_schedule"});
    d(chunks_per_partition, "chunks_per_partition",
      "pipeline parallelism: model chunks per partition (interleaved schedule)",
      {.min = 1, .max = 64, .former_name = "virtual_stages"});
    d(partition_splits, "partition_splits",
      "pipeline parallelism: ViT block indices where chunks begin, e.g. [6] (empty: as "
      "partition_balance says)",
      {.type = ParamType::kIntList});
    d(partition_balance, "partition_balance",
      "pipeline parallelism without partition_splits: blocks (chunks of as equal a count of "
      "blocks as they divide) or measured (of as equal a cost, each block's forward and "
      "backward timed on a probe batch at the start, with the embedding and the heads; across "
      "ranks rank 0 times them, and a resumed run keeps its checkpoint's splits)");
  }
};

struct TrainStepOptions {
  std::uint64_t seed = 0;
  std::string init;
  std::string init_skip;
  KdLossOptions loss;
  OptimizerOptions optimizer;
  std::uint64_t total_steps = 0;
  double clip_grad_norm = 1.0;
  double ema_decay = 0.0;
  OnNonfinite on_nonfinite = OnNonfinite::kFail;
  int intraop_threads = 1;
  std::string autocast = "none";
  std::string device = "auto";
  std::string checkpoint_dir;
  std::uint64_t checkpoint_every = 0;
  std::uint64_t keep_checkpoints = 2;
  std::uint64_t snapshot_every = 0;
  bool resume = false;
  double first_bucket_mb = 1.0;
  double bucket_mb = 25.0;
  ZeroLevel zero = ZeroLevel::kNone;
  PartitionStepOptions partitioned;
  // Declared first (its keys lead the list), but the last field: as the first, GCC 12 at -O3
  // warns falsely (-Wmaybe-uninitialized) about its string in option_specs<TrainStepOptions>.
  ModelOptions model;
  template <class Declare>
  void declare(Declare& d) {
    model.declare(d);
    d(seed, "seed", "seed of the initial weights and of dropout", {.min = 0});
    d(init, "init",
      "initial weights from a PyTorch file: a state_dict saved by torch.save, a .safetensors "
      "file or a flowtrain checkpoint, with our names (timm's for a ViT, torchvision's for a "
      "ResNet) or torchvision's VisionTransformer names; every tensor must match (see "
      "docs/models.md). A resumed run takes its checkpoint instead (empty: none)",
      {.type = ParamType::kOutputPath});
    d(init_skip, "init_skip",
      "with init: comma-separated name prefixes left as initialised, e.g. \"head\" for a new "
      "classifier (the report counts init_loaded and init_skipped)");
    loss.declare(d);
    optimizer.declare(d);
    d(total_steps, "total_steps", "schedule length in steps (0: the batches the data will give)",
      {.min = 0});
    d(clip_grad_norm, "clip_grad_norm", "clip the gradient's global norm to this (0: off)",
      {.min = 0});
    d(ema_decay, "ema_decay",
      "> 0: also average the weights (exponential moving average, decay min(ema_decay, "
      "(1 + step) / (10 + step))); checkpoints carry the average, and evaluation, export and "
      "teacher_infer use it (0: off)",
      {.min = 0, .max = 0.99999});
    d(on_nonfinite, "on_nonfinite",
      "a NaN/infinite loss or gradient: stop the run, or skip the update and count it");
    declare_intraop_threads(d, intraop_threads);
    declare_autocast(d, autocast);
    declare_device(d, device);
    d(checkpoint_dir, "checkpoint_dir", "folder for checkpoints (empty: none written)",
      {.type = ParamType::kOutputPath});
    d(checkpoint_every, "checkpoint_every", "write a checkpoint every N steps (0: only at the end)",
      {.min = 0});
    d(keep_checkpoints, "keep_checkpoints", "step checkpoints kept (older ones are deleted)",
      {.min = 1});
    d(snapshot_every, "snapshot_every",
      "also write the model alone (no optimizer state) every N steps to "
      "checkpoint_dir/snapshots/, to validate along the training (0: never)",
      {.min = 0});
    d(resume, "resume",
      "continue from the newest checkpoint in checkpoint_dir, if there is one (a group torchrun "
      "restarted under --max_restarts always does)");
    d(first_bucket_mb, "first_bucket_mb",
      "data-parallel: size of the first gradient bucket to all-reduce (MB)", {.min = 0});
    d(bucket_mb, "bucket_mb", "data-parallel: size of the other gradient buckets (MB)", {.min = 0});
    d(zero, "zero",
      "data-parallel ZeRO level (the ZeRO paper's stage): 1 (or true) shards the optimizer state "
      "across the ranks (with pipelines side by side, a partition's among its replicas), 2 the "
      "gradients too; 0 (or false): every rank holds all of both");
    partitioned.declare(d);
  }
};

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
/// records, `<name>/step_log`, `<name>/checkpoint` and `<name>/snapshot`, which write them. With
/// `partitions` P > 1 in one process the entry runs the model's first partition and brings
/// `<name>/partition1` .. `<name>/partition<P-1>` (TrainPartitionStage) before grad_sync, which
/// work on each step at the same time (a graph built with Pipeline::add must add them too: the
/// entry's partition 0 waits for them). The entry's row reports the whole step's numbers. With
/// resume: true the newest checkpoint in checkpoint_dir is restored and the run continues
/// exactly where it stopped. (`student_step` is its former name, still accepted.)
class TrainStepStage final : public FlatMap<data::Batch, GradBucket> {
 public:
  using Options = TrainStepOptions;
  /// `context`: the run's services; its process group (dist::World) if the run is a rank of
  /// a job.
  explicit TrainStepStage(const Options& options, const BuildContext& context = {});
  ~TrainStepStage() override;
  static StageDoc describe();
  static std::vector<ExpandedNode> expand(const Params& params, const RunOptions& run);
  /// The model (its preset with the params over it), the pipeline params and the files' params
  /// make sense together; throws Error otherwise (what the constructor would refuse).
  static void check(const Options& options);

  bool requires_order() const override { return true; }
  std::size_t threads_per_invocation() const override { return session_->intraop_threads; }
  bool intra_op_parallel() const override { return true; }
  /// The buckets of each batch.
  std::optional<std::uint64_t> plan(std::optional<std::uint64_t> batches) override;
  std::optional<ResumePosition> resume_position() const override;
  std::vector<StageResult> results() const override;
  std::vector<TimelineSpan> timeline() const override;
  /// With partition nodes: partition 0's wait for the others' tensors.
  StageWait waiting() const override;
  void cancel() override;
  /// step, total_steps, epoch (1-based), loss (smoothed over recent steps), images.
  std::vector<StageResult> live_results() const override;

  const std::vector<StepRecord>& history() const { return session_->history; }
  const TrainState& state() const { return session_->trainer->state(); }
  ImageModel& model() { return session_->trainer->model(); }

 protected:
  void process(data::Batch&& batch, Emitter<GradBucket>& out) override;
  /// Resumed at the end (TrainingSession::resumed_at_the_end): hands optimizer_step the session
  /// in a passed-over bucket, so that it writes the final checkpoint no step of this run wrote.
  void finish(Emitter<GradBucket>& out) override;

 private:
  std::shared_ptr<TrainingSession> session_;
  std::unique_ptr<FolderLock> lock_;  // this run's claim on checkpoint_dir
  std::uint64_t configured_total_steps_;
  bool partition_nodes_ = false;  // the partitions after the first run in nodes after this one
  int microbatches_ = 1;
};

}  // namespace flowtrain::train
