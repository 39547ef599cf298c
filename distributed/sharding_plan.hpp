#pragma once

#include <cstdint>
#include <vector>

#include <c10/core/Device.h>

#include "distributed/torch_compat.hpp"
#include "distributed/zero.hpp"

namespace flowtrain::dist {

class World;

/// Where a partitioned model's parameters live across ranks: the partition each parameter
/// belongs to, this rank's partition, the ranks of its pipeline and (pipelines side by side)
/// those holding the same partition in the others.
struct PartitionRanks {
  std::vector<int> partition_of;  // [parameter]
  int partition = 0;
  Group* pipeline = nullptr;
  Group* replicas = nullptr;  // nullptr: one pipeline
};

/// Which rank keeps which parameter's optimizer state and gradient. With ZeRO (stage 1: the
/// optimizer state; 2: the gradients too) the parameters are shared out among the ranks as
/// ZeroRedundancyOptimizer balances them; with a partitioned model each rank keeps its
/// partition's (and with ZeRO, its balanced share of it among the partition's replicas).
struct ShardingPlan {
  /// The ShardedOptimizer's levels, outermost last; empty: no sharding (a plain AdamW).
  std::vector<ShardedOptimizer::Level> levels;
  /// [parameter]: whether this rank's GradSync reduces it (empty: all of them).
  std::vector<bool> sync_selected;
  /// ZeRO-2: [parameter of sync_selected] the rank of the sync's group it goes to (empty:
  /// every rank gets every average).
  std::vector<int> sync_owners;
  /// [parameter]: whether this rank holds its gradient after the sync; within `grad_group` each
  /// gradient is held by one rank. Empty: every rank holds every gradient.
  std::vector<bool> grad_held;
  Group* grad_group = nullptr;
};

/// The plan for parameters of `numels` elements on `world`'s ranks with ZeRO stage `zero`, and
/// with `partitioned` when the model's partitions are ranks; gradients on `device` sync
/// through its group (World::group_for). No sharding without a world, or with neither ZeRO nor
/// partitions.
ShardingPlan plan_sharding(const std::vector<std::int64_t>& numels,
                           int zero,
                           World* world,
                           const c10::Device& device,
                           const PartitionRanks* partitioned);

}  // namespace flowtrain::dist
