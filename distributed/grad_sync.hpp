#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "distributed/torch_compat.hpp"

namespace flowtrain::dist {

class World;

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

/// Data-parallel gradient averaging for one model, built on the world's c10d process group (Gloo
/// on CPU, NCCL on GPUs): PyTorch's DistributedDataParallel reducer, in C++.
///
/// On construction rank 0 broadcasts the parameters and buffers, so every rank starts equal,
/// and the ranks check that they made the same buckets. During backward, a hook on each
/// parameter copies its gradient into its bucket's flat buffer; when a bucket is full its
/// all-reduce starts asynchronously, overlapping the rest of backward. After backward,
/// `end_backward()` checks that every parameter got one gradient; `complete(b)` waits for
/// bucket b's all-reduce (World::wait: a rank that failed, hung or took fewer steps is named
/// within seconds) and writes its averaged gradients back (buckets may complete in any
/// order, on any threads: they touch disjoint parameters); `end_step()` closes the step. The
/// graph runs `complete` as the `grad_sync` node, one message per bucket.
///
/// With `owners` (ZeRO-2: which rank's optimizer shard updates each parameter), a bucket is
/// not all-reduced but reduced: each owner's part of it (its parameters, side by side in the
/// bucket) goes to that owner alone, and `complete(b)` leaves a gradient only on the parameters
/// this rank owns, freeing the others and the bucket's buffer. After the step a rank then holds
/// about 1/world of the gradients instead of all of them, and no bucket buffers.
///
/// Averaging over the whole world, it holds the world's StopVote: `end_backward()` starts an
/// all-reduce of the ranks' votes behind the buckets', `end_step()` waits for it, and once any
/// rank voted (got SIGINT or SIGTERM) every rank learns it in the same step, and
/// `stop_agreed()` says so from then on (graph/stop_vote.hpp).
///
///   GradSync sync(model, *world, {.first_bucket_bytes = 1 << 20});
///   loss.backward();  // buckets start reducing as they fill
///   sync.end_backward();
///   for (std::size_t b = 0; b < sync.buckets().size(); ++b) sync.complete(b);
///   sync.end_step();  // every gradient averaged over the ranks
///   optimizer.step();
class GradSync {
 public:
  struct Options {
    std::int64_t first_bucket_bytes = 1 << 20;   // PyTorch DDP: 1 MB
    std::int64_t bucket_bytes = 25 << 20;        // PyTorch DDP: 25 MB
    std::vector<int> owners;  // per parameter, its optimizer shard's rank (ZeRO-2); empty: all
    /// The ranks that average (a pipeline partition's data-parallel replicas); null: the
    /// world's group for the parameters' device (World::group_for). Ranks and owners above
    /// are ranks of this group.
    Group* group = nullptr;
    /// Which of the module's parameters take part (a pipeline partition's); empty: all.
    std::vector<bool> selected;
    /// Gradients accumulate over several backward passes (a pipeline's micro-batches), so no
    /// hooks: reduce_accumulated() starts every bucket after the last pass.
    bool accumulate = false;
  };

  GradSync(torch::nn::Module& model, World& world, Options options);
  ~GradSync();
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;

  /// With `accumulate`, after the step's last backward pass: starts every bucket's reduction
  /// from the gradients the parameters accumulated.
  void reduce_accumulated();
  /// After backward: throws Error naming a parameter that got no gradient (unused in the
  /// forward) or two; the step is then abandoned.
  void end_backward();
  /// Waits for bucket b's reduction and writes its averaged gradients to the parameters (with
  /// owners: to this rank's, the others' gradients are freed). Thread-safe for different buckets.
  void complete(std::size_t b);
  /// After every bucket completed: accounts the step's communication time, readies the next;
  /// learns the ranks' stop votes.
  void end_step();
  /// Whether the ranks agreed to stop after a step that ended (every rank learns it after the
  /// same one): its caller trains no further batch.
  bool stop_agreed() const;

  const std::vector<Bucket>& buckets() const;
  /// Communication time, summed over steps: from the start of a step's first reduction to the
  /// end of its last. comm - wait is the part hidden behind backward.
  double comm_seconds() const;
  /// Bytes reduced, summed over steps.
  std::uint64_t reduced_bytes() const;
  /// Bytes of the buckets' buffers kept between steps (none with owners: made for a step).
  std::int64_t buffer_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace flowtrain::dist
