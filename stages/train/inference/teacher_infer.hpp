#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "graph/registry.hpp"
#include "stages/data/batch.hpp"
#include "stages/train/inference/inference_model.hpp"
#include "stages/train/models/compute.hpp"
#include "stages/train/partitioned/schedule.hpp"

namespace flowtrain::train {

/// Runs a frozen teacher on each batch and adds its outputs (Batch::teacher_logits, and
/// teacher_regression for a model with a regression head). No gradients, eval mode, its own
/// intra-op thread count, optional bf16 autocast (its matrix products' parameters cast once at
/// load; InferenceModel::Precision). The teacher is a flowtrain checkpoint or any
/// TorchScript module; with concurrency > 1 several batches run through it at once, ahead of
/// the student. Behind a teacher_cache it runs only on the rows the cache lacks
/// (Batch::teacher_pending) and hands their outputs to it.
///
/// With `partitions` P > 1 (a checkpoint) the teacher is a forward-only pipeline of graph
/// nodes: the entry runs the first chunk of the model's blocks, and brings the nodes
/// `<name>/partition1` .. `<name>/partition<P-1>` (type teacher_partition), each running the
/// next chunk on its own intra-op threads and handing its activation on in the batch
/// (Batch::teacher_activation); the last adds the outputs. Successive batches are the
/// pipeline's micro-batches: while one partition runs batch k, the one before runs batch k + 1.
struct TeacherInferOptions {
  InferenceOptions inference;
  std::string init;
  int ranks_per_shard = 1;
  int partitions = 1;
  std::vector<double> partition_splits;
  PartitionBalance partition_balance = PartitionBalance::kBlocks;
  template <class Declare>
  void declare(Declare& d) {
    inference.declare(d);
    d(init, "init",
      "with a flowtrain checkpoint as model: its architecture with the weights of this file "
      "instead (a PyTorch state_dict from torch.save or a .safetensors file, every tensor "
      "matching; see docs/models.md); not behind a teacher_cache (empty: the checkpoint's "
      "weights)",
      {.type = ParamType::kOutputPath});
    d(ranks_per_shard, "ranks_per_shard",
      "pipeline ranks that share their samples (the training source's ranks_per_shard): only "
      "the last of each such group runs the teacher, as only the last partition uses its "
      "outputs; the others pass their batches on without them",
      {.min = 1, .max = 1 << 20});
    d(partitions, "partitions",
      "pipeline parallelism in one process (a flowtrain checkpoint): graph nodes that each run "
      "a chunk of the teacher's blocks on their own intraop_threads, the entry the first and "
      "<name>/partition1 .. the next, successive batches flowing through them (1: none)",
      {.min = 1, .max = 256});
    d(partition_splits, "partition_splits",
      "with partitions: block indices where chunks begin, e.g. [6] (empty: as "
      "partition_balance says)",
      {.type = ParamType::kIntList});
    d(partition_balance, "partition_balance",
      "with partitions and no partition_splits: blocks (chunks of as equal a count of blocks "
      "as they divide) or measured (of as equal a cost: each piece's forward timed on a probe "
      "batch of 16 when the first node is built, once per process for every node)");
  }
};

/// A node a `teacher_infer` entry with partitions brings: its options, and which chunk it runs.
struct TeacherPartitionOptions {
  TeacherInferOptions teacher;
  int partition = 1;
  template <class Declare>
  void declare(Declare& d) {
    teacher.declare(d);
    d(partition, "partition", "the chunk this node runs (1 .. partitions - 1; the entry runs 0)",
      {.min = 1, .max = 255});
  }
};

class TeacherInferStage : public Map<data::Batch, data::Batch> {
 public:
  using Options = TeacherInferOptions;
  /// `context`: the run's services; its job placement says whether this rank's batches need
  /// teacher outputs (ranks_per_shard).
  explicit TeacherInferStage(const Options& options,
                             const BuildContext& context = {},
                             int partition = 0);
  ~TeacherInferStage() override;
  static StageDoc describe();
  /// With partitions, the nodes `<name>/partition1` ... (teacher_partition), always.
  static std::vector<ExpandedNode> expand(const Params& params, const RunOptions& run);

  std::size_t threads_per_invocation() const override { return intraop_threads_; }
  bool intra_op_parallel() const override { return true; }
  /// Behind a teacher_cache, the teacher must be the one the cache keys its entries by (the
  /// same model content and autocast): else one line naming both models, before the run, since
  /// a warm cache would never ask this stage and a half-warm one would mix two teachers.
  std::string input_problem(const Stage& input) const override;
  /// images (the teacher ran on), forward_ms (per batch), and gflops: the forward's matrix-product
  /// FLOPs (ModelConfig::forward_flops) per second of forward, per invocation (its
  /// intraop_threads); gflops is left out for a TorchScript teacher, whose shape is unknown. A
  /// partition gives its blocks (`first_block`, `blocks`) and the weights it holds
  /// (`weights_mb`) in place of gflops, and `activation_mb`: the activation it hands on, per
  /// batch.
  std::vector<StageResult> results() const override;

 protected:
  std::optional<data::Batch> process(data::Batch&& batch, ItemContext& ctx) override;

 private:
  /// The teacher's outputs for `images` (this partition's: from the activation of the one
  /// before, except the first), timed (`seconds`) and counted; the activation for the next
  /// partition goes to `activation`.
  ModelOutput forward(const at::Tensor& input, double& seconds, at::Tensor& activation);
  bool last() const { return end_ == model_->blocks(); }
  /// teacher_fingerprint of this stage's model and precision, computed once.
  std::uint64_t fingerprint() const;

  std::unique_ptr<InferenceModel> model_;
  std::string model_path_;
  std::string init_;  // the weights file over the checkpoint's, if any
  std::string autocast_;  // none, bf16 or fp16
  bool on_cpu_;           // else on a GPU
  mutable std::once_flag fingerprint_once_;
  mutable std::uint64_t fingerprint_ = 0;  // made when a teacher_cache first asks
  int intraop_threads_;
  bool skip_ = false;  // a pipeline rank before the last: its batches need no teacher outputs
  int partitions_ = 1;
  int begin_ = 0, end_ = 0;  // the blocks this node runs: all of them without partitions
  std::atomic<std::uint64_t> images_{0}, batches_{0}, forward_ns_{0}, activation_bytes_{0};
};

/// A chunk of a partitioned teacher after the first (TeacherInferStage's `partitions`).
class TeacherPartitionStage final : public TeacherInferStage {
 public:
  using Options = TeacherPartitionOptions;
  explicit TeacherPartitionStage(const Options& options, const BuildContext& context = {})
      : TeacherInferStage(options.teacher, context, options.partition) {}
  static StageDoc describe();
};

}  // namespace flowtrain::train
