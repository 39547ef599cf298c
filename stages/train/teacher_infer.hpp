#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "graph/registry.hpp"
#include "stages/data/batch.hpp"
#include "stages/train/compute.hpp"
#include "stages/train/inference_model.hpp"

namespace flowtrain::train {

/// Runs a frozen teacher on each batch and adds its outputs (Batch::teacher_logits, and
/// teacher_regression for a model with a regression head). No gradients, eval mode, its own
/// intra-op thread count, optional bf16 autocast (its matrix products' parameters cast once at
/// load; InferenceModel::Precision). The teacher is a flowtrain checkpoint or any
/// TorchScript module; with concurrency > 1 several batches run through it at once, ahead of
/// the student. Behind a teacher_cache it runs only on the rows the cache lacks
/// (Batch::teacher_pending) and hands their outputs to it.
struct TeacherInferOptions {
  InferenceOptions inference;
  int ranks_per_shard = 1;
  template <class Declare>
  void declare(Declare& d) {
    inference.declare(d);
    d(ranks_per_shard, "ranks_per_shard",
      "pipeline ranks that share their samples (the training source's ranks_per_shard): only "
      "the last of each such group runs the teacher, as only the last partition uses its "
      "outputs; the others pass their batches on without them",
      {.min = 1, .max = 1 << 20});
  }
};

class TeacherInferStage final : public Map<data::Batch, data::Batch> {
 public:
  using Options = TeacherInferOptions;
  explicit TeacherInferStage(const Options& options);
  ~TeacherInferStage() override;
  static StageDoc describe();

  std::size_t threads_per_invocation() const override { return intraop_threads_; }
  bool intra_op_parallel() const override { return true; }
  /// A forward's outputs do not depend on its intra-op threads (each output element's sum is
  /// one thread's), so a tuner may change them between runs.
  bool set_threads_per_invocation(std::size_t threads) override {
    intraop_threads_ = static_cast<int>(threads);
    return true;
  }
  /// images (the teacher ran on), forward_ms (per batch), and gflops: the forward's matrix-product FLOPs
  /// (ModelConfig::forward_flops) per second of forward, per invocation (its intraop_threads);
  /// gflops is left out for a TorchScript teacher, whose shape is unknown.
  std::vector<StageResult> results() const override;

 protected:
  std::optional<data::Batch> process(data::Batch&& batch, ItemContext& ctx) override;

 private:
  /// The teacher's outputs for `images`, timed (`seconds`) and counted.
  ModelOutput forward(const at::Tensor& images, double& seconds);

  std::unique_ptr<InferenceModel> model_;
  std::string model_path_;
  InferenceModel::Precision precision_;
  std::once_flag fingerprint_once_;
  std::uint64_t fingerprint_ = 0;  // teacher_fingerprint, made when a teacher_cache first asks
  int intraop_threads_;
  bool skip_ = false;  // a pipeline rank before the last: its batches need no teacher outputs
  std::atomic<std::uint64_t> images_{0}, batches_{0}, forward_ns_{0};
};

}  // namespace flowtrain::train
