#include "distributed/partition_link.hpp"

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <array>
#include <utility>
#include <vector>

#include "distributed/world.hpp"
#include "graph/error.hpp"

namespace flowtrain::dist {

namespace {

// A header: dtype, number of dimensions, up to kMaxDims sizes, the batch's number and digest.
constexpr std::int64_t kMaxDims = 6;
constexpr std::int64_t kHeader = 2 + kMaxDims + 2;

}  // namespace

struct PartitionLink::Impl {
  World& world;                // its wait() names a rank that fails or lags
  Group& group;                // the pipeline's ranks
  int first_rank;              // the job rank of the group's rank 0
  std::array<std::int64_t, 2> batch{};  // number, digest of its samples
  // Sends in flight, with the tensors they read from (from the one thread that runs this
  // process's pipeline rank).
  std::vector<std::pair<c10::intrusive_ptr<c10d::Work>, std::vector<torch::Tensor>>> sending;

  Impl(World& w, Group& g, int first) : world(w), group(g), first_rank(first) {}

  std::string job_rank(int r) const { return "rank " + std::to_string(first_rank + r); }

  void start_send(std::vector<torch::Tensor> tensors, int to, int tag) {
    c10::intrusive_ptr<c10d::Work> work = group.send(tensors, to, tag);
    sending.emplace_back(std::move(work), std::move(tensors));
  }

  void receive(torch::Tensor tensor, int from, int tag, const std::string& what) {
    std::vector<torch::Tensor> tensors = {std::move(tensor)};
    world.wait(*group.recv(tensors, from, tag), "receiving " + what + " from " + job_rank(from));
  }
};

PartitionLink::PartitionLink(World& world, Group& group, int first_rank)
    : impl_(std::make_unique<Impl>(world, group, first_rank)) {}

PartitionLink::~PartitionLink() = default;

void PartitionLink::set_batch(std::uint64_t number, std::uint64_t digest) {
  impl_->batch = {static_cast<std::int64_t>(number), static_cast<std::int64_t>(digest)};
}

int PartitionLink::rank() const { return impl_->group.getRank(); }

void PartitionLink::send(int to, int tag, const torch::Tensor& tensor, const std::string& what) {
  if (tensor.dim() > kMaxDims || !tensor.is_contiguous()) {
    throw Error("pipeline link: cannot send " + what + " (" + std::to_string(tensor.dim()) +
                " dimensions" + (tensor.is_contiguous() ? "" : ", not contiguous") + ")");
  }
  torch::Tensor header = torch::zeros({kHeader}, torch::kLong);
  auto* h = header.data_ptr<std::int64_t>();
  h[0] = static_cast<std::int64_t>(tensor.scalar_type());
  h[1] = tensor.dim();
  for (std::int64_t d = 0; d < tensor.dim(); ++d) h[2 + d] = tensor.size(d);
  h[2 + kMaxDims] = impl_->batch[0];
  h[3 + kMaxDims] = impl_->batch[1];
  impl_->start_send({header}, to, 2 * tag);
  impl_->start_send({tensor}, to, 2 * tag + 1);
}

torch::Tensor PartitionLink::recv(int from, int tag, const std::string& what) {
  torch::Tensor header = torch::empty({kHeader}, torch::kLong);
  impl_->receive(header, from, 2 * tag, what);
  const auto* h = header.data_ptr<std::int64_t>();
  const std::int64_t number = h[2 + kMaxDims], digest = h[3 + kMaxDims];
  if (number != impl_->batch[0] || digest != impl_->batch[1]) {
    throw Error(impl_->job_rank(from) + " sent " + what + " of batch " +
                std::to_string(number) + ", but this rank holds batch " +
                std::to_string(impl_->batch[0]) +
                (number == impl_->batch[0] ? " with other samples" : "") +
                ": the ranks of a pipeline must read the same batches (give the training "
                "source ranks_per_shard: <partitions>)");
  }
  if (h[1] < 0 || h[1] > kMaxDims) {
    throw Error(impl_->job_rank(from) + " sent a damaged header for " + what);
  }
  const std::vector<std::int64_t> shape(h + 2, h + 2 + h[1]);
  torch::Tensor tensor =
      torch::empty(shape, torch::TensorOptions().dtype(static_cast<c10::ScalarType>(h[0])));
  impl_->receive(tensor, from, 2 * tag + 1, what);
  return tensor;
}

void PartitionLink::flush() {
  for (auto& [work, tensors] : impl_->sending) impl_->world.wait(*work, "a pipeline send");
  impl_->sending.clear();
}

}  // namespace flowtrain::dist
