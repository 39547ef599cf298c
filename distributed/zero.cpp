#include "distributed/zero.hpp"

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/utils/tensor_flatten.h>
#include <torch/torch.h>

#include <algorithm>

#include "distributed/world.hpp"
#include "graph/error.hpp"

namespace flowtrain::dist {

std::vector<int> partition_parameters(const std::vector<std::int64_t>& numels, int ranks) {
  std::vector<std::int64_t> load(static_cast<std::size_t>(ranks), 0);
  std::vector<int> owner;
  for (const std::int64_t n : numels) {
    const auto least = std::min_element(load.begin(), load.end());
    owner.push_back(static_cast<int>(least - load.begin()));
    *least += n;
  }
  return owner;
}

std::int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer) {
  std::int64_t bytes = 0;
  for (const auto& [key, state] : optimizer.state()) {
    if (const auto* adamw = dynamic_cast<const torch::optim::AdamWParamState*>(state.get())) {
      for (const torch::Tensor& t : {adamw->exp_avg(), adamw->exp_avg_sq(), adamw->max_exp_avg_sq()}) {
        if (t.defined()) bytes += t.numel() * static_cast<std::int64_t>(t.element_size());
      }
    }
  }
  return bytes;
}

struct ShardedOptimizer::Impl {
  // One level of gathering: per rank of its group, the parameters it owns and a buffer for them.
  struct Gather {
    Group* group;
    std::vector<std::vector<torch::Tensor>> by_owner;
    std::vector<torch::Tensor> flat;
  };
  std::vector<Gather> levels;
  World* world = nullptr;
  std::unique_ptr<torch::optim::AdamW> local;
  std::size_t owned = 0;
};

ShardedOptimizer::ShardedOptimizer(const Named& params,
                                   Group& group,
                                   const Factory& make,
                                   std::vector<int> owners)
    : ShardedOptimizer(params, {Level{&group, std::move(owners)}}, make) {}

ShardedOptimizer::ShardedOptimizer(const Named& params,
                                   std::vector<Level> levels,
                                   const Factory& make,
                                   World* world)
    : impl_(std::make_unique<Impl>()) {
  impl_->world = world;
  std::vector<bool> mine(params.size(), true);
  for (Level& level : levels) {
    const int ranks = level.group->getSize();
    if (level.owners.empty()) {
      std::vector<std::int64_t> numels;
      for (const auto& item : params) numels.push_back(item.second.numel());
      level.owners = partition_parameters(numels, ranks);
    }
    if (level.owners.size() != params.size()) {
      throw Error("ShardedOptimizer: " + std::to_string(level.owners.size()) + " owners for " +
                  std::to_string(params.size()) + " parameters");
    }
    Impl::Gather& gather = impl_->levels.emplace_back();
    gather.group = level.group;
    gather.by_owner.resize(static_cast<std::size_t>(ranks));
    for (std::size_t k = 0; k < params.size(); ++k) {
      const int owner = level.owners[k];
      if (owner < -1 || owner >= ranks) {
        throw Error("ShardedOptimizer: " + params[k].first + " owned by rank " +
                    std::to_string(owner) + " of " + std::to_string(ranks));
      }
      if (owner < 0) continue;
      gather.by_owner[static_cast<std::size_t>(owner)].push_back(params[k].second);
      if (owner != level.group->getRank()) mine[k] = false;
    }
    for (const std::vector<torch::Tensor>& shard : gather.by_owner) {
      gather.flat.push_back(shard.empty() ? torch::Tensor()
                                          : torch::utils::flatten_dense_tensors(shard));
    }
  }
  Named local;
  for (std::size_t k = 0; k < params.size(); ++k) {
    if (mine[k]) local.push_back(params[k]);
  }
  impl_->owned = local.size();
  impl_->local = make(local);
}

ShardedOptimizer::~ShardedOptimizer() = default;

void ShardedOptimizer::step() {
  impl_->local->step();
  // Every rank gets each shard from its owner: one broadcast per owner and level, through a
  // buffer made once. The owner packs its updated parameters; the others unpack what arrives.
  torch::NoGradGuard no_grad;
  for (Impl::Gather& gather : impl_->levels) {
    const auto rank = static_cast<std::size_t>(gather.group->getRank());
    for (std::size_t r = 0; r < gather.by_owner.size(); ++r) {
      const std::vector<torch::Tensor>& shard = gather.by_owner[r];
      if (shard.empty()) continue;
      torch::Tensor& flat = gather.flat[r];
      std::int64_t offset = 0;
      for (const torch::Tensor& p : shard) {
        if (r == rank) flat.narrow(0, offset, p.numel()).copy_(p.reshape({-1}));
        offset += p.numel();
      }
      std::vector<torch::Tensor> buffer = {flat};
      c10d::BroadcastOptions options;
      options.rootRank = static_cast<int64_t>(r);
      const c10::intrusive_ptr<c10d::Work> work = gather.group->broadcast(buffer, options);
      if (impl_->world) {
        impl_->world->wait(*work, "the gather of updated parameters from their owner");
      } else {
        work->wait();
      }
      if (r == rank) continue;
      offset = 0;
      for (const torch::Tensor& p : shard) {
        p.copy_(flat.narrow(0, offset, p.numel()).view_as(p));
        offset += p.numel();
      }
    }
  }
}

torch::optim::AdamW& ShardedOptimizer::local() { return *impl_->local; }
std::int64_t ShardedOptimizer::state_bytes() const { return optimizer_state_bytes(*impl_->local); }
std::size_t ShardedOptimizer::owned() const { return impl_->owned; }

}  // namespace flowtrain::dist
