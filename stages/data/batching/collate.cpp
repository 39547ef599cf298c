#include "stages/data/batching/collate.hpp"

#include <algorithm>

#include "graph/error.hpp"
#include "stages/data/decode/opencv_threads.hpp"
#include "stages/data/splitmix.hpp"
#include "stages/data/transforms/recipe.hpp"

namespace flowtrain::data {

CollateStage::CollateStage(const Options& options)
    : batch_size_(options.batch_size),
      drop_last_(options.drop_last),
      normalize_(options.normalize),
      recipe_(mix_recipe(0, "collate", to_params(options.normalize))),
      wait_timeout_s_(options.pool.wait_timeout_s),
      pool_(BatchPool::create(options.pool)) {
  keep_opencv_on_caller_thread();
}

StageDoc CollateStage::describe() {
  return {"Collates RGB samples into normalised NCHW float32 batches from a bounded buffer pool.",
          option_specs<Options>()};
}

void CollateStage::process(Sample&& sample, Emitter<Batch>& out) {
  const Image& img = sample.image;
  if (img.channels != 3 || img.empty()) {
    throw Error(sample.path +
                ": collate needs decoded RGB images (put jpeg_decode and augment "
                "before it)");
  }
  if (targets_ < 0) {
    height_ = img.height;
    width_ = img.width;
    targets_ = static_cast<std::int64_t>(sample.targets.size());
  }
  if (img.height != height_ || img.width != width_ ||
      static_cast<std::int64_t>(sample.targets.size()) != targets_) {
    throw Error(sample.path + ": sample is " + std::to_string(img.width) + "x" +
                std::to_string(img.height) + " with " + std::to_string(sample.targets.size()) +
                " targets, but the batch is " + std::to_string(width_) + "x" +
                std::to_string(height_) + " with " + std::to_string(targets_) +
                "; give augment a fixed size");
  }
  if (!batch_.open()) {
    batch_.start(pool_->acquire(batch_size_, 3, height_, width_, targets_, wait_timeout_s_),
                 batch_size_);
  }
  BatchBuffers& buffers = batch_.buffers();
  const std::int64_t row = batch_.rows();
  normalize_(img, buffers.images.data_ptr<float>() + row * 3 * height_ * width_);
  buffers.labels.data_ptr<std::int64_t>()[row] = sample.label;
  std::copy(sample.targets.begin(), sample.targets.end(),
            buffers.targets.data_ptr<float>() + row * targets_);
  batch_.add({sample.index, sample.epoch, sample.augment, recipe_ ^ splitmix64(sample.recipe)},
             std::move(sample.path));
  end_position_ = sample.position + 1;
  origin_ = sample.origin;
  if (batch_.rows() == batch_size_) out.emit(batch_.take(end_position_, origin_));
}

std::optional<std::uint64_t> CollateStage::plan(std::optional<std::uint64_t> samples) {
  if (!samples) return std::nullopt;
  const auto batch = static_cast<std::uint64_t>(batch_size_);
  return drop_last_ ? *samples / batch : (*samples + batch - 1) / batch;
}

void CollateStage::finish(Emitter<Batch>& out) {
  if (batch_.open() && !drop_last_ && !out.stopped()) out.emit(batch_.take(end_position_, origin_));
  batch_.discard();
}

FLOWTRAIN_REGISTER_STAGE("collate", CollateStage);

}  // namespace flowtrain::data
