#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "graph/registry.hpp"
#include "stages/data/batch.hpp"
#include "stages/data/batching/batch_pool.hpp"
#include "stages/data/transforms/normalizer.hpp"

namespace flowtrain::data {

/// The params of the `collate` stage.
struct CollateOptions {
  std::int64_t batch_size = 64;
  bool drop_last = false;
  NormalizeOptions normalize;
  BatchPoolOptions pool;
  template <class Declare>
  void declare(Declare& d) {
    d(batch_size, "batch_size", "samples per batch", {.min = 1, .max = 1 << 20});
    d(drop_last, "drop_last",
      "drop the last batch if it is smaller (a run that is stopped always drops its partial "
      "batch: resuming redoes it whole)");
    normalize.declare(d);
    pool.declare(d);
  }
};

/// Collates samples into NCHW float32 batches, normalising on the way ((pixel / 255 - mean) /
/// std, fused with the HWC -> CHW copy straight into a pooled buffer). Batches leave in sample
/// order. With `device: cuda`, where LibTorch has CUDA, buffers are pinned, and a
/// `stage_to_device` node after it copies each batch to the GPU; without CUDA that path
/// compiles away.
class CollateStage final : public FlatMap<Sample, Batch> {
 public:
  using Options = CollateOptions;
  explicit CollateStage(const Options& options);
  /// Throws Error on params the constructor would refuse (std not three values > 0).
  static void check(const Options& options) { Normalizer{options.normalize}; }
  static StageDoc describe();
  bool requires_order() const override { return true; }
  /// Batches from the expected samples: floor(n / batch_size), or ceil without drop_last.
  std::optional<std::uint64_t> plan(std::optional<std::uint64_t> samples) override;

  BatchPool::Stats pool_stats() const { return pool_->stats(); }
  /// Waits for a free batch buffer (BatchPool::waiting).
  StageWait waiting() const override { return pool_->waiting(); }

 protected:
  void process(Sample&& sample, Emitter<Batch>& out) override;
  void finish(Emitter<Batch>& out) override;

 private:
  std::int64_t batch_size_;
  bool drop_last_;
  Normalizer normalize_;
  std::uint64_t recipe_;  // mixed into each row's ViewKey::recipe: its normalisation
  double wait_timeout_s_;
  std::shared_ptr<BatchPool> pool_;

  BatchFiller batch_;
  std::uint64_t end_position_ = 0;  // source position after the last sample taken
  const SampleOrigin* origin_ = nullptr;  // that sample's source
  // Shape fixed by the first sample.
  std::int64_t height_ = 0, width_ = 0, targets_ = -1;
};

}  // namespace flowtrain::data
