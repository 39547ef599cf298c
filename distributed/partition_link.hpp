#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <torch/types.h>

#include "distributed/torch_compat.hpp"

namespace flowtrain::dist {

class World;

/// How the ranks of a partitioned model split over processes hand each other tensors: one
/// process runs one model rank (its `rank()`), and a tensor for a model stage another rank holds
/// goes out through `send`, to arrive through that rank's `recv` with the same tag.
/// PartitionLink below gives one over c10d point-to-point ops (Gloo here, NCCL where CUDA).
class PartitionTransport {
 public:
  virtual ~PartitionTransport() = default;
  /// The pipeline rank this process runs.
  virtual int rank() const = 0;
  /// Starts sending `tensor` (contiguous; kept alive until flush) to pipeline rank `to`.
  /// `what` names it in errors: "stage 1's input of micro-batch 3".
  virtual void send(int to, int tag, const torch::Tensor& tensor, const std::string& what) = 0;
  /// Waits for what rank `from` sent under `tag`.
  virtual torch::Tensor recv(int from, int tag, const std::string& what) = 0;
  /// Waits until every send of this batch has been taken.
  virtual void flush() = 0;
};

/// Pipeline ranks in separate processes: pipeline rank r is rank r of a c10d process group (the
/// job's, or with data parallelism too, the pipeline's subgroup: job ranks first_rank + r), and
/// tensors travel by point-to-point send and recv (Gloo here, NCCL where LibTorch has CUDA).
/// Each tensor goes as a small header (dtype, shape, and the batch it belongs to) and then its
/// data, so the receiver allocates it and checks that both ranks hold the same batch. A receive
/// waits through World::wait: a rank that failed or stopped responding is named within seconds
/// instead of after the timeout.
///
///   PartitionLink link(*world, world->group(), 0);
///   link.set_batch(batch.number, digest);  // of the batch's samples
///   run_partitioned_batch(schedule, stages, input, threads, weights, &link);
class PartitionLink final : public PartitionTransport {
 public:
  PartitionLink(World& world, Group& group, int first_rank);
  ~PartitionLink() override;

  /// The batch the next tensors belong to, by its number and a digest of its samples: a
  /// receiver holding another batch fails, naming both.
  void set_batch(std::uint64_t number, std::uint64_t digest);

  int rank() const override;
  void send(int to, int tag, const torch::Tensor& tensor, const std::string& what) override;
  torch::Tensor recv(int from, int tag, const std::string& what) override;
  void flush() override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace flowtrain::dist
