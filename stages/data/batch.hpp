#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "stages/data/sample.hpp"

namespace flowtrain::data {

/// What identifies the exact view of one sample in a batch (a teacher-output cache key).
struct ViewKey {
  std::uint64_t index = 0;
  std::uint32_t epoch = 0;
  AugmentParams augment;
  std::uint64_t recipe = 0;  // Sample::recipe: the params that made its pixels
  std::uint64_t mix = 0;     // how `mixup` mixed the row: a digest of its partner's view and the draw; 0: unmixed

  bool operator==(const ViewKey&) const = default;
};

/// The tensors of a pooled batch buffer (see BatchPool).
struct BatchBuffers {
  at::Tensor images;   // [B, C, H, W] float32 (pinned host memory where batches go to a GPU)
  at::Tensor labels;   // [B] int64
  at::Tensor targets;  // [B, T] float32
};

/// One sample already written into its row of a pooled batch buffer (by `decode_crop`), on its
/// way to `assemble_batch`, which emits the batch once its rows are in.
struct BatchRow {
  std::uint64_t batch = 0;       // batch number in the run: the sample's sequence / batch_size
  std::int64_t row = 0;          // row in that batch: the sequence % batch_size
  std::int64_t batch_size = 0;   // rows of a full batch
  std::uint64_t position = 0;    // the sample's source position
  const SampleOrigin* origin = nullptr;  // its source (for Batch::end_shared_position)
  ViewKey view;
  std::string path;
  std::shared_ptr<BatchBuffers> buffers;  // the batch's buffers, shared by its rows
};

struct Batch;

/// The teacher outputs a cache (the `teacher_cache` stage) could not supply for a batch: the
/// rows the teacher must run on, and where its outputs go. Carried by the batches a cache sends
/// to its `miss` output; teacher_infer runs on rows() only and hands the outputs to complete().
/// Destroyed without complete() (the batch failed or was dropped), it gives the rows up, so a
/// later batch waiting for them fails instead of hanging.
class TeacherOutputsPending {
 public:
  virtual ~TeacherOutputsPending() = default;
  /// Rows of the batch the teacher must compute, in order (maybe none: rows an earlier batch
  /// computes are only waited for).
  virtual const std::vector<std::int64_t>& rows() const = 0;
  /// Stores the outputs of rows() (`logits` [rows, classes], `regression` [rows, K] or
  /// undefined), computed in `forward_s` seconds by the teacher `teacher` (its fingerprint, which
  /// must be the cache's), and sets the batch's teacher_logits and teacher_regression for all
  /// its rows, as stored.
  virtual void complete(Batch& batch,
                        const at::Tensor& logits,
                        const at::Tensor& regression,
                        double forward_s,
                        std::uint64_t teacher) = 0;
};

/// A batch's copy to a GPU still in flight (stage_to_device's, on a side stream). Destroyed
/// with the batch, after it waits for the copy: the pinned buffer the copy reads from goes back
/// to its pool only once the copy is done.
struct DeviceCopy {
  virtual ~DeviceCopy() = default;
  /// Makes the calling thread's current stream wait for the copy (the host does not wait), and
  /// the copied tensors' memory known to be in use by that stream.
  virtual void wait_on_current_stream() const = 0;
};

/// A collated batch. `images` lives in a buffer leased from the collate stage's bounded pool;
/// the lease returns it when the last copy of the batch is destroyed.
struct Batch {
  std::uint64_t number = 0;    // batch number in the run, in order
  std::uint64_t end_position = 0;  // source position after its last sample: where to resume
  /// The same in the order the data-parallel ranks share (SampleOrigin::shared_position):
  /// where a job resumed on another number of ranks starts; std::nullopt where unknown.
  std::optional<std::uint64_t> end_shared_position;
  at::Tensor images;           // [N, C, H, W] float32, normalized
  at::Tensor labels;           // [N] int64
  at::Tensor targets;          // [N, T] float32 (T = 0 without numeric targets)
  std::vector<ViewKey> views;  // one per row
  std::vector<std::string> paths;
  /// Rows mixed by `mixup`: each row's own share of its image and label ([N] float32), and
  /// its partner's row ([N] int64), whose label takes the rest; undefined: no mixing.
  at::Tensor label_mix;
  at::Tensor mix_partner;
  at::Tensor teacher_logits;      // [N, classes], added by a teacher stage; else undefined
  at::Tensor teacher_regression;  // [N, K], with a teacher's regression head; else undefined
  /// Set by a teacher_cache on the batches it cannot fill alone; teacher_infer completes it.
  std::shared_ptr<TeacherOutputsPending> teacher_pending;
  /// A partitioned teacher's activation between its partitions (teacher_infer's
  /// `partitions`; of teacher_pending's rows only, behind a cache); undefined elsewhere.
  at::Tensor teacher_activation;
  std::shared_ptr<void> lease;
  /// Set by stage_to_device while the copy to a GPU may be in flight (after `lease`: destroyed
  /// first); a consumer calls wait_copied() before its GPU work reads the batch.
  std::shared_ptr<const DeviceCopy> copy;

  /// Orders the calling thread's GPU work after the batch's copy to the GPU (nothing if none).
  void wait_copied() const {
    if (copy) copy->wait_on_current_stream();
  }
  std::int64_t size() const { return images.defined() ? images.size(0) : 0; }
};

}  // namespace flowtrain::data
