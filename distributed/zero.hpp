#pragma once

#include <torch/nn/module.h>
#include <torch/optim/adamw.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "distributed/torch_compat.hpp"

namespace flowtrain::dist {

class World;

/// Which rank owns each parameter under ZeRO stage 1, as PyTorch's ZeroRedundancyOptimizer
/// partitions them: in order, each parameter to the rank with the fewest elements so far.
std::vector<int> partition_parameters(const std::vector<std::int64_t>& numels, int ranks);

/// ZeRO stage 1 (PyTorch's ZeroRedundancyOptimizer): the optimizer state is sharded across the
/// ranks. Each rank keeps an optimizer over the parameters it owns only, updates them from the
/// (already averaged) gradients, then every parameter is broadcast from its owner, so all ranks
/// end the step with the same weights. Optimizer memory per rank is about 1/world of the whole.
///
///   ShardedOptimizer zero(model->named_parameters(), group, [&](auto& shard) {
///     return make_adamw(shard, options);
///   });
///   ... sync.end_step();  // gradients averaged
///   zero.step();
class ShardedOptimizer {
 public:
  using Named = std::vector<std::pair<std::string, torch::Tensor>>;
  using Factory = std::function<std::unique_ptr<torch::optim::AdamW>(const Named& shard)>;

  /// `owners[k]`: the rank that owns params[k] (pipeline parallelism: the rank holding its
  /// partition); empty: partition_parameters, ZeroRedundancyOptimizer's balance.
  ShardedOptimizer(const Named& params,
                   Group& group,
                   const Factory& make,
                   std::vector<int> owners = {});

  /// Sharded over several groups in turn (pipeline partitions that are also data-parallel:
  /// within a partition's replicas, then along the pipeline). A level's owners[k] is the rank of
  /// its group that owns params[k], or -1 where the level leaves params[k] alone. This rank
  /// updates the parameters it owns at every level that names it; the step then gathers level
  /// by level, each parameter broadcast from its owner within each group.
  struct Level {
    Group* group;
    std::vector<int> owners;
  };
  /// With `world`, each gather waits through World::wait: a rank that died or hung is named
  /// within seconds instead of after the collective's timeout.
  ShardedOptimizer(const Named& params,
                   std::vector<Level> levels,
                   const Factory& make,
                   World* world = nullptr);
  ~ShardedOptimizer();

  /// Updates this rank's shard, then gathers every parameter from its owner.
  void step();
  /// This rank's optimizer (its shard's state), for the learning rate and checkpoints.
  torch::optim::AdamW& local();
  /// Bytes of optimizer state this rank holds (exp_avg and exp_avg_sq of its shard).
  std::int64_t state_bytes() const;
  /// Parameters this rank owns.
  std::size_t owned() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Bytes of state an optimizer holds (all tensors in its per-parameter state).
std::int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer);

}  // namespace flowtrain::dist
