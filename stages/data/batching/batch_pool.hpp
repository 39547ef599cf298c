#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "graph/options.hpp"
#include "graph/stage.hpp"
#include "stages/data/batch.hpp"

namespace flowtrain::data {

/// The `pool_size`, `wait_timeout_s` and `device` params of the stages that fill a BatchPool.
struct BatchPoolOptions {
  std::int64_t pool_size = 4;
  double wait_timeout_s = 60;
  std::string device = "auto";
  template <class Declare>
  void declare(Declare& d) {
    d(pool_size, "pool_size",
      "batch buffers at most; >= next queue_capacity + its concurrency + 1 never waits",
      {.min = 1});
    d(wait_timeout_s, "wait_timeout_s", "how long to wait for a free buffer before failing",
      {.min = 0});
    d(device, "device",
      "where the batches go (auto, cpu, cuda, cuda:N): on a GPU the buffers are pinned host "
      "memory, for stage_to_device's async copy");
  }
};

/// A bounded pool of batch buffers (images, labels, targets) of one shape. Buffers are made on
/// demand up to `capacity`, then reused: no allocation in steady state, and memory bounded.
/// A lease returns its buffer when released, from any thread.
class BatchPool : public std::enable_shared_from_this<BatchPool> {
 public:
  using Buffers = BatchBuffers;
  struct Stats {
    std::size_t allocated = 0;  // buffers made so far
    std::size_t peak_in_use = 0;
    std::size_t waits = 0;  // acquires that found every buffer leased
    double wait_s = 0;      // how long they waited, summed
  };

  /// `device`: where the batches go (dist::resolve_device); on a GPU the buffers are pinned
  /// host memory. Throws Error for a device this build or host lacks.
  static std::shared_ptr<BatchPool> create(std::size_t capacity, const std::string& device);
  /// With `pool_size` buffers for `device` (wait_timeout_s is the caller's, for acquire).
  static std::shared_ptr<BatchPool> create(const BatchPoolOptions& options);

  /// A free buffer set of this shape, waiting up to `timeout_s` for one if all `capacity` are
  /// leased; throws Error if none frees up (a consumer keeps batches, or the pool is too small).
  std::shared_ptr<Buffers> acquire(std::int64_t batch,
                                   std::int64_t channels,
                                   std::int64_t height,
                                   std::int64_t width,
                                   std::int64_t targets,
                                   double timeout_s);
  Stats stats() const;
  /// What the stage filling the pool waited for (Stage::waiting): free buffers, `pool_size`.
  StageWait waiting() const;

 private:
  BatchPool(std::size_t capacity, bool pinned);
  void release(Buffers* buffers);

  const std::size_t capacity_;
  const bool pinned_;
  mutable std::mutex mutex_;
  std::condition_variable freed_;
  std::vector<std::unique_ptr<Buffers>> free_;
  std::size_t in_use_ = 0;
  Stats stats_;
};

/// The batch a serial batcher (collate, assemble_batch) is filling: its pooled buffers, its rows'
/// view keys and paths, and the numbering of the batches it hands out.
class BatchFiller {
 public:
  bool open() const { return buffers_ != nullptr; }
  /// Begins a batch in `buffers`, of at most `capacity` rows.
  void start(std::shared_ptr<BatchBuffers> buffers, std::int64_t capacity);
  BatchBuffers& buffers() { return *buffers_; }
  /// Rows added so far: the next row to fill.
  std::int64_t rows() const { return rows_; }
  /// Counts the row just written, with its view key and path.
  void add(const ViewKey& view, std::string path);

  /// The rows added so far as a Batch that resumes at source position `end_position` of
  /// `origin` (nullptr: a source that cannot say its shared position), holding the lease;
  /// closes the batch (stage_to_device then copies it to a GPU).
  Batch take(std::uint64_t end_position, const SampleOrigin* origin);
  /// Drops the batch being filled, if any (its buffers go back to the pool).
  void discard();

 private:
  std::shared_ptr<BatchBuffers> buffers_;
  std::int64_t rows_ = 0;
  std::vector<ViewKey> views_;
  std::vector<std::string> paths_;
  std::uint64_t next_number_ = 0;
};

/// Moves row `from` of the buffers to row `to` (images, labels, targets): closes the gap a
/// dropped sample left in a batch.
void move_row(BatchBuffers& buffers, std::int64_t from, std::int64_t to);

}  // namespace flowtrain::data
