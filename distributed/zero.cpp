#include "distributed/zero.hpp"

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/utils/tensor_flatten.h>
#include <torch/torch.h>

#include <algorithm>

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
  c10d::ProcessGroup& group;
  std::vector<std::vector<torch::Tensor>> by_owner;  // [rank] -> the parameters it owns
  std::vector<torch::Tensor> flat;                   // [rank] -> one buffer for its shard
  std::unique_ptr<torch::optim::AdamW> local;
  std::size_t owned = 0;

  explicit Impl(c10d::ProcessGroup& g) : group(g) {}
};

ShardedOptimizer::ShardedOptimizer(const Named& params,
                                   c10d::ProcessGroup& group,
                                   const Factory& make,
                                   std::vector<int> owner)
    : impl_(std::make_unique<Impl>(group)) {
  if (owner.empty()) {
    std::vector<std::int64_t> numels;
    for (const auto& item : params) numels.push_back(item.second.numel());
    owner = partition_parameters(numels, group.getSize());
  }
  if (owner.size() != params.size()) {
    throw Error("ShardedOptimizer: " + std::to_string(owner.size()) + " owners for " +
                std::to_string(params.size()) + " parameters");
  }
  impl_->by_owner.resize(static_cast<std::size_t>(group.getSize()));
  Named mine;
  for (std::size_t k = 0; k < params.size(); ++k) {
    if (owner[k] < 0 || owner[k] >= group.getSize()) {
      throw Error("ShardedOptimizer: " + params[k].first + " owned by rank " +
                  std::to_string(owner[k]) + " of " + std::to_string(group.getSize()));
    }
    impl_->by_owner[static_cast<std::size_t>(owner[k])].push_back(params[k].second);
    if (owner[k] == group.getRank()) mine.push_back(params[k]);
  }
  impl_->owned = mine.size();
  for (const std::vector<torch::Tensor>& shard : impl_->by_owner) {
    impl_->flat.push_back(shard.empty() ? torch::Tensor()
                                        : torch::utils::flatten_dense_tensors(shard));
  }
  impl_->local = make(mine);
}

ShardedOptimizer::~ShardedOptimizer() = default;

void ShardedOptimizer::step() {
  impl_->local->step();
  // Every rank gets each shard from its owner: one broadcast per owner, through a buffer made
  // once. The owner packs its updated parameters; the others unpack what arrives.
  torch::NoGradGuard no_grad;
  const auto rank = static_cast<std::size_t>(impl_->group.getRank());
  for (std::size_t r = 0; r < impl_->by_owner.size(); ++r) {
    const std::vector<torch::Tensor>& shard = impl_->by_owner[r];
    if (shard.empty()) continue;
    torch::Tensor& flat = impl_->flat[r];
    std::int64_t offset = 0;
    for (const torch::Tensor& p : shard) {
      if (r == rank) flat.narrow(0, offset, p.numel()).copy_(p.reshape({-1}));
      offset += p.numel();
    }
    std::vector<torch::Tensor> buffer = {flat};
    c10d::BroadcastOptions options;
    options.rootRank = static_cast<int64_t>(r);
    impl_->group.broadcast(buffer, options)->wait();
    if (r == rank) continue;
    offset = 0;
    for (const torch::Tensor& p : shard) {
      p.copy_(flat.narrow(0, offset, p.numel()).view_as(p));
      offset += p.numel();
    }
  }
}

torch::optim::AdamW& ShardedOptimizer::local() { return *impl_->local; }
std::int64_t ShardedOptimizer::state_bytes() const { return optimizer_state_bytes(*impl_->local); }
std::size_t ShardedOptimizer::owned() const { return impl_->owned; }

}  // namespace flowtrain::dist
