#include "stages/data/batching/batch_pool.hpp"

#include <ATen/ops/empty.h>

#include <chrono>
#include <cstring>

#include "distributed/device.hpp"
#include "graph/error.hpp"

namespace flowtrain::data {

BatchPool::BatchPool(std::size_t capacity, bool pinned) : capacity_(capacity), pinned_(pinned) {}

std::shared_ptr<BatchPool> BatchPool::create(std::size_t capacity, const std::string& device) {
  const bool pinned = dist::resolve_device(device).is_cuda();
  return std::shared_ptr<BatchPool>(new BatchPool(capacity, pinned));
}

std::shared_ptr<BatchPool> BatchPool::create(const BatchPoolOptions& options) {
  return create(static_cast<std::size_t>(options.pool_size), options.device);
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
      const auto begin = std::chrono::steady_clock::now();
      const bool freed = freed_.wait_for(lock, timeout, [this] { return !free_.empty(); });
      ++stats_.waits;
      stats_.wait_s +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
      if (!freed) {
        throw Error("all " + std::to_string(capacity_) + " batch buffers stayed in use for " +
                    std::to_string(static_cast<int>(timeout_s)) +
                    " s; a later stage keeps batches, or pool_size is below the batches in flight "
                    "(next queue_capacity + its concurrency + 1, and one more for a batch being "
                    "filled in parallel)");
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

StageWait BatchPool::waiting() const {
  return {stats().wait_s, "a free batch buffer", "pool_size", static_cast<double>(capacity_)};
}

BatchPool::Stats BatchPool::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void BatchFiller::start(std::shared_ptr<BatchBuffers> buffers, std::int64_t capacity) {
  buffers_ = std::move(buffers);
  rows_ = 0;
  // The last batch took the vectors; size the new ones once rather than grow them per row.
  views_.reserve(static_cast<std::size_t>(capacity));
  paths_.reserve(static_cast<std::size_t>(capacity));
}

void BatchFiller::add(const ViewKey& view, std::string path) {
  views_.push_back(view);
  paths_.push_back(std::move(path));
  ++rows_;
}

void BatchFiller::discard() {
  buffers_.reset();
  rows_ = 0;
  views_ = {};
  paths_ = {};
}

Batch BatchFiller::take(std::uint64_t end_position, const SampleOrigin* origin) {
  Batch batch;
  batch.number = next_number_++;
  batch.end_position = end_position;
  if (origin) batch.end_shared_position = origin->shared_position(end_position);
  batch.views = std::move(views_);
  batch.paths = std::move(paths_);
  std::shared_ptr<BatchBuffers> buffers = std::move(buffers_);
  batch.images = buffers->images.narrow(0, 0, rows_);
  batch.labels = buffers->labels.narrow(0, 0, rows_);
  batch.targets = buffers->targets.narrow(0, 0, rows_);
  discard();
  batch.lease = std::move(buffers);
  return batch;
}

void move_row(BatchBuffers& buffers, std::int64_t from, std::int64_t to) {
  buffers.images[to].copy_(buffers.images[from]);
  buffers.labels[to].copy_(buffers.labels[from]);
  buffers.targets[to].copy_(buffers.targets[from]);
}

}  // namespace flowtrain::data
