#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "graph/registry.hpp"
#include "stages/data/batch.hpp"

namespace flowtrain::data {

/// A bounded pool of batch buffers (images, labels, targets) of one shape. Buffers are made on
/// demand up to `capacity`, then reused: no allocation in steady state, and memory bounded.
/// A lease returns its buffer when released, from any thread.
class BatchPool : public std::enable_shared_from_this<BatchPool> {
 public:
  struct Buffers {
    at::Tensor images;   // [B, C, H, W] float32 (pinned host memory on CUDA builds)
    at::Tensor labels;   // [B] int64
    at::Tensor targets;  // [B, T] float32
  };
  struct Stats {
    std::size_t allocated = 0;  // buffers made so far
    std::size_t peak_in_use = 0;
  };

  static std::shared_ptr<BatchPool> create(std::size_t capacity, bool pinned);

  /// A free buffer set of this shape, waiting up to `timeout_s` for one if all `capacity` are
  /// leased; throws Error if none frees up (a consumer keeps batches, or the pool is too small).
  std::shared_ptr<Buffers> acquire(std::int64_t batch,
                                   std::int64_t channels,
                                   std::int64_t height,
                                   std::int64_t width,
                                   std::int64_t targets,
                                   double timeout_s);
  Stats stats() const;

 private:
  BatchPool(std::size_t capacity, bool pinned) : capacity_(capacity), pinned_(pinned) {}
  void release(Buffers* buffers);

  const std::size_t capacity_;
  const bool pinned_;
  mutable std::mutex mutex_;
  std::condition_variable freed_;
  std::vector<std::unique_ptr<Buffers>> free_;
  std::size_t in_use_ = 0;
  Stats stats_;
};

/// (pixel / 255 - mean) / std, fused with the HWC -> CHW copy: how collate fills a batch row,
/// for code that prepares single images the same way (a predict tool).
///
///   const Normalizer normalize({0.485, 0.456, 0.406}, {0.229, 0.224, 0.225});
///   normalize(image, row.data_ptr<float>());  // row: [3, H, W] float32
class Normalizer {
 public:
  /// Throws Error unless mean and std have 3 values (R, G, B) and every std is > 0.
  Normalizer(const std::vector<double>& mean, const std::vector<double>& std);
  /// Writes the 3 x height x width floats of an RGB image to `chw`.
  void operator()(const Image& rgb, float* chw) const;

 private:
  float scale_[3];
  float bias_[3];
};

/// Collates samples into NCHW float32 batches, normalising on the way ((pixel / 255 - mean) /
/// std, fused with the HWC -> CHW copy straight into a pooled buffer). Batches leave in sample
/// order. With `device: cuda`, where LibTorch has CUDA, buffers are pinned and each batch is
/// copied to the GPU with non_blocking on a side stream; without CUDA that path compiles away.
class CollateStage final : public FlatMap<Sample, Batch> {
 public:
  explicit CollateStage(const Params& params);
  static StageDoc describe();
  bool requires_order() const override { return true; }
  /// Batches from the expected samples: floor(n / batch_size), or ceil without drop_last.
  std::optional<std::uint64_t> plan(std::optional<std::uint64_t> samples) override;

  BatchPool::Stats pool_stats() const { return pool_->stats(); }

 protected:
  void process(Sample&& sample, Emitter<Batch>& out) override;
  void finish(Emitter<Batch>& out) override;

 private:
  void emit(Emitter<Batch>& out);

  std::int64_t batch_size_;
  bool drop_last_;
  Normalizer normalize_;
  double wait_timeout_s_;
  std::string device_;
  std::shared_ptr<BatchPool> pool_;

  // The batch being filled.
  std::shared_ptr<BatchPool::Buffers> buffers_;
  std::int64_t filled_ = 0;
  std::vector<ViewKey> views_;
  std::vector<std::string> paths_;
  std::uint64_t next_number_ = 0;
  std::uint64_t end_position_ = 0;  // source position after the last sample taken
  // Shape fixed by the first sample.
  std::int64_t height_ = 0, width_ = 0, targets_ = -1;
};

}  // namespace flowtrain::data
