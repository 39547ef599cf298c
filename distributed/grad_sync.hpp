#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace c10d {
class ProcessGroup;
}

namespace flowtrain::dist {

/// Which parameters (by index in the module's parameter list) share a bucket.
struct Bucket {
  std::vector<std::size_t> params;
  std::int64_t numel = 0;
};

/// Splits parameters into buckets the way PyTorch's DDP does: in reverse registration order
/// (gradients of the last layers are ready first during backward), the first bucket up to
/// `first_bucket_bytes`, the others up to `bucket_bytes`; a parameter larger than the cap gets a
/// bucket of its own. Deterministic in the sizes alone, so every rank makes the same buckets.
std::vector<Bucket> assign_buckets(const std::vector<std::int64_t>& numels,
                                   std::int64_t element_bytes,
                                   std::int64_t first_bucket_bytes,
                                   std::int64_t bucket_bytes);

/// Data-parallel gradient averaging for one model, built on a c10d process group (Gloo on CPU,
/// NCCL on GPUs): PyTorch's DistributedDataParallel reducer, in C++.
///
/// On construction rank 0 broadcasts the parameters and buffers, so every rank starts equal,
/// and the ranks check that they made the same buckets. During backward, a hook on each
/// parameter copies its gradient into its bucket's flat buffer; when a bucket is full its
/// all-reduce starts asynchronously, overlapping the rest of backward. `finish()` waits for
/// every bucket (in bucket order), averages and writes the gradients back; call it before
/// clipping and the optimizer step.
///
///   GradSync sync(model, world->group(), {.first_bucket_bytes = 1 << 20});
///   loss.backward();  // buckets start reducing as they fill
///   sync.finish();    // every gradient averaged over the ranks
///   optimizer.step();
class GradSync {
 public:
  struct Options {
    std::int64_t first_bucket_bytes = 1 << 20;   // PyTorch DDP: 1 MB
    std::int64_t bucket_bytes = 25 << 20;        // PyTorch DDP: 25 MB
  };

  GradSync(torch::nn::Module& model, c10d::ProcessGroup& group, Options options);
  ~GradSync();
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;

  /// Waits for every bucket's all-reduce and writes the averaged gradients to the parameters.
  /// Throws Error naming a parameter that got no gradient (unused in the forward) or two.
  void finish();

  const std::vector<Bucket>& buckets() const;
  /// Time spent waiting for all-reduces in finish() (the part not hidden behind backward), and
  /// bytes reduced, summed over steps.
  double wait_seconds() const;
  /// Communication time, summed over steps: from the start of a step's first reduction to the
  /// end of its last. comm - wait is the part hidden behind backward.
  double comm_seconds() const;
  std::uint64_t reduced_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace flowtrain::dist
