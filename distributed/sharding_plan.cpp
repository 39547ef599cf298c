#include "distributed/sharding_plan.hpp"

#include "distributed/world.hpp"

namespace flowtrain::dist {

ShardingPlan plan_sharding(const std::vector<std::int64_t>& numels,
                           int zero,
                           World* world,
                           const c10::Device& device,
                           const PartitionRanks* partitioned) {
  ShardingPlan plan;
  if (!partitioned && !(zero > 0 && world)) return plan;
  if (!partitioned) {
    plan.levels.push_back({&world->group_for(device), partition_parameters(numels, world->size())});
    if (zero >= 2) {
      plan.sync_owners = plan.levels.back().owners;
      for (const int owner : plan.sync_owners) plan.grad_held.push_back(owner == world->rank());
      plan.grad_group = &world->group_for(device);
    }
    return plan;
  }
  // Each rank keeps its partition's parameters and updates those; after each step the other
  // ranks get them.
  for (const int partition : partitioned->partition_of) {
    plan.sync_selected.push_back(partition == partitioned->partition);
  }
  plan.grad_held = plan.sync_selected;
  plan.grad_group = partitioned->pipeline;
  if (zero > 0) {
    // Its share of the partition, balanced among the partition's replicas.
    std::vector<std::int64_t> mine;
    for (std::size_t k = 0; k < numels.size(); ++k) {
      if (plan.sync_selected[k]) mine.push_back(numels[k]);
    }
    const int replica = partitioned->replicas->getRank();
    const std::vector<int> shares = partition_parameters(mine, partitioned->replicas->getSize());
    std::vector<int> owners(numels.size(), -1);  // other partitions: not this level's
    for (std::size_t k = 0, i = 0; k < numels.size(); ++k) {
      if (!plan.sync_selected[k]) continue;
      owners[k] = shares[i++];
      if (zero >= 2) plan.grad_held[k] = owners[k] == replica;
    }
    if (zero >= 2) {
      plan.sync_owners = shares;
      plan.grad_group = &world->group_for(device);  // each gradient now on one rank of all
    }
    plan.levels.push_back({partitioned->replicas, std::move(owners)});
  }
  plan.levels.push_back({partitioned->pipeline, partitioned->partition_of});
  return plan;
}

}  // namespace flowtrain::dist
