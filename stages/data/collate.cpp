#include "stages/data/collate.hpp"

#include <ATen/ops/empty.h>

#include <chrono>
#include <opencv2/core.hpp>

#include "graph/error.hpp"
#include "stages/data/opencv_threads.hpp"

#if FLOWTRAIN_WITH_CUDA
#include <ATen/Context.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace flowtrain::data {

std::shared_ptr<BatchPool> BatchPool::create(std::size_t capacity, bool pinned) {
  return std::shared_ptr<BatchPool>(new BatchPool(capacity, pinned));
}

std::shared_ptr<BatchPool::Buffers> BatchPool::acquire(std::int64_t batch,
                                                       std::int64_t channels,
                                                       std::int64_t height,
                                                       std::int64_t width,
                                                       std::int64_t targets,
                                                       double timeout_s) {
  std::unique_ptr<Buffers> buffers;
  {
    std::unique_lock lock(mutex_);
    if (free_.empty() && stats_.allocated >= capacity_) {
      const auto timeout = std::chrono::duration<double>(timeout_s);
      if (!freed_.wait_for(lock, timeout, [this] { return !free_.empty(); })) {
        throw Error("all " + std::to_string(capacity_) + " batch buffers stayed in use for " +
                    std::to_string(static_cast<int>(timeout_s)) +
                    " s; a later stage keeps batches, or pool_size is below the batches in flight "
                    "(next queue_capacity + its concurrency + 1)");
      }
    }
    if (!free_.empty()) {
      buffers = std::move(free_.back());
      free_.pop_back();
    } else {
      ++stats_.allocated;
    }
    stats_.peak_in_use = std::max(stats_.peak_in_use, ++in_use_);
  }
  if (!buffers) {
    // Outside the lock: first-touch of fresh memory is slow on these machines.
    const auto options = at::TensorOptions().pinned_memory(pinned_);
    buffers = std::make_unique<Buffers>();
    buffers->images = at::empty({batch, channels, height, width}, options.dtype(at::kFloat));
    buffers->labels = at::empty({batch}, options.dtype(at::kLong));
    buffers->targets = at::empty({batch, targets}, options.dtype(at::kFloat));
  }
  auto self = shared_from_this();
  return std::shared_ptr<Buffers>(buffers.release(), [self](Buffers* b) { self->release(b); });
}

void BatchPool::release(Buffers* buffers) {
  {
    std::lock_guard lock(mutex_);
    free_.emplace_back(buffers);
    --in_use_;
  }
  freed_.notify_one();
}

BatchPool::Stats BatchPool::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

namespace {
bool wants_cuda(const std::string& device) { return device.rfind("cuda", 0) == 0; }
}  // namespace

Normalizer::Normalizer(const std::vector<double>& mean, const std::vector<double>& std) {
  if (mean.size() != 3 || std.size() != 3) {
    throw Error("params 'mean' and 'std' need 3 values (R, G, B)");
  }
  for (int c = 0; c < 3; ++c) {
    if (!(std[c] > 0)) throw Error("param 'std' values must be > 0");
    scale_[c] = static_cast<float>(1.0 / (255.0 * std[c]));
    bias_[c] = static_cast<float>(-mean[c] / std[c]);
  }
}

void Normalizer::operator()(const Image& img, float* chw) const {
  // Split into channel planes, then one scaled conversion per plane into the output memory.
  const cv::Mat rgb(img.height, img.width, CV_8UC3, const_cast<std::uint8_t*>(img.pixels.data()));
  thread_local cv::Mat planes[3];  // scratch, reused
  cv::split(rgb, planes);
  const std::int64_t plane_size = std::int64_t{img.height} * img.width;
  for (int c = 0; c < 3; ++c) {
    cv::Mat plane(img.height, img.width, CV_32F, chw + c * plane_size);
    planes[c].convertTo(plane, CV_32F, scale_[c], bias_[c]);
  }
}

CollateStage::CollateStage(const Params& params)
    : batch_size_(params.get_int("batch_size")),
      drop_last_(params.get_bool("drop_last")),
      normalize_(params.get<std::vector<double>>("mean"), params.get<std::vector<double>>("std")),
      wait_timeout_s_(params.get_float("wait_timeout_s")),
      device_(params.get_string("device")) {
  keep_opencv_on_caller_thread();
  if (device_ != "cpu" && !wants_cuda(device_)) {
    throw Error("param 'device' must be 'cpu' or 'cuda[:N]', got '" + device_ + "'");
  }
#if FLOWTRAIN_WITH_CUDA
  if (wants_cuda(device_) && !at::hasCUDA()) {
    throw Error("device '" + device_ + "' requested but no CUDA device is available");
  }
#else
  if (wants_cuda(device_)) {
    throw Error("device '" + device_ +
                "' requested but this LibTorch was built without CUDA; use device: cpu");
  }
#endif
  pool_ =
      BatchPool::create(static_cast<std::size_t>(params.get_int("pool_size")), wants_cuda(device_));
}

StageDoc CollateStage::describe() {
  return {
      "Collates RGB samples into normalised NCHW float32 batches from a bounded buffer pool.",
      {int_param("batch_size", 64, "samples per batch", 1),
       bool_param("drop_last", false, "drop the last batch if it is smaller"),
       float_list_param("mean", {0.485, 0.456, 0.406}, "per-channel mean (of pixel / 255)"),
       float_list_param("std", {0.229, 0.224, 0.225}, "per-channel std (of pixel / 255)"),
       int_param("pool_size", 4,
                 "batch buffers at most; >= next queue_capacity + its concurrency + 1 never "
                 "waits",
                 1),
       float_param("wait_timeout_s", 60, "how long to wait for a free buffer before failing", 0),
       string_param("device", "cpu", "cpu, or cuda[:N] (pinned buffers, async copy)")}};
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
  if (!buffers_) {
    buffers_ = pool_->acquire(batch_size_, 3, height_, width_, targets_, wait_timeout_s_);
    // The last batch took the vectors; size the new ones once rather than grow them per sample.
    views_.reserve(static_cast<std::size_t>(batch_size_));
    paths_.reserve(static_cast<std::size_t>(batch_size_));
  }

  normalize_(img, buffers_->images.data_ptr<float>() + filled_ * 3 * height_ * width_);
  buffers_->labels.data_ptr<std::int64_t>()[filled_] = sample.label;
  std::copy(sample.targets.begin(), sample.targets.end(),
            buffers_->targets.data_ptr<float>() + filled_ * targets_);
  views_.push_back({sample.index, sample.epoch, sample.augment});
  end_position_ = sample.position + 1;
  paths_.push_back(std::move(sample.path));
  if (++filled_ == batch_size_) emit(out);
}

std::optional<std::uint64_t> CollateStage::plan(std::optional<std::uint64_t> samples) {
  if (!samples) return std::nullopt;
  const auto batch = static_cast<std::uint64_t>(batch_size_);
  return drop_last_ ? *samples / batch : (*samples + batch - 1) / batch;
}

void CollateStage::finish(Emitter<Batch>& out) {
  if (filled_ > 0 && !drop_last_) emit(out);
  buffers_.reset();
  filled_ = 0;
}

void CollateStage::emit(Emitter<Batch>& out) {
  Batch batch;
  batch.number = next_number_++;
  batch.end_position = end_position_;
  batch.images = buffers_->images.narrow(0, 0, filled_);
  batch.labels = buffers_->labels.narrow(0, 0, filled_);
  batch.targets = buffers_->targets.narrow(0, 0, filled_);
  batch.views = std::move(views_);
  batch.paths = std::move(paths_);
#if FLOWTRAIN_WITH_CUDA
  if (wants_cuda(device_)) {
    // Copy on a side stream so it overlaps the model's work on the default stream; this thread
    // waits for the copy, then the pinned buffer goes back to the pool at once.
    const at::Device device(device_);
    c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool(false, device.index());
    c10::cuda::CUDAStreamGuard guard(stream);
    batch.images = batch.images.to(device, /*non_blocking=*/true);
    batch.labels = batch.labels.to(device, /*non_blocking=*/true);
    batch.targets = batch.targets.to(device, /*non_blocking=*/true);
    stream.synchronize();
    buffers_.reset();
  }
#endif
  batch.lease = std::move(buffers_);
  filled_ = 0;
  views_ = {};
  paths_ = {};
  out.emit(std::move(batch));
}

FLOWTRAIN_REGISTER_STAGE("collate", CollateStage);

}  // namespace flowtrain::data
