#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "distributed/torch_compat.hpp"
#include "stages/train/pipeline.hpp"

namespace flowtrain::dist {
class World;
}

namespace flowtrain::train {

/// Pipeline ranks in separate processes: pipeline rank r is rank r of a c10d process group (the
/// job's, or with data parallelism too, the pipeline's subgroup: job ranks first_rank + r), and
/// tensors travel by point-to-point send and recv (Gloo here, NCCL where LibTorch has CUDA).
/// Each tensor goes as a small header (dtype, shape, and the batch it belongs to) and then its
/// data, so the receiver allocates it and checks that both ranks hold the same batch. A receive
/// waits through World::wait: a rank that failed or stopped responding is named within seconds
/// instead of after the timeout.
///
///   PipelineLink link(*world, world->group(), 0);
///   link.set_batch(batch.number, digest);  // of the batch's samples
///   run_pipeline_batch(schedule, stages, input, threads, weights, &link);
class PipelineLink final : public PipelineTransport {
 public:
  PipelineLink(dist::World& world, dist::Group& group, int first_rank);
  ~PipelineLink() override;

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

}  // namespace flowtrain::train
