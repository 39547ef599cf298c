#include "distributed/grad_sync.hpp"

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <mutex>

#include "distributed/world.hpp"
#include "graph/error.hpp"

namespace flowtrain::dist {

std::vector<Bucket> assign_buckets(const std::vector<std::int64_t>& numels,
                                   std::int64_t element_bytes,
                                   std::int64_t first_bucket_bytes,
                                   std::int64_t bucket_bytes) {
  std::vector<Bucket> buckets;
  Bucket current;
  for (std::size_t k = numels.size(); k-- > 0;) {
    const std::int64_t cap = buckets.empty() ? first_bucket_bytes : bucket_bytes;
    if (!current.params.empty() && (current.numel + numels[k]) * element_bytes > cap) {
      buckets.push_back(std::move(current));
      current = {};
    }
    current.params.push_back(k);
    current.numel += numels[k];
  }
  if (!current.params.empty()) buckets.push_back(std::move(current));
  return buckets;
}

struct GradSync::Impl {
  World& world;  // its wait() names a rank that fails or lags
  Group& group;  // reduces: the world's, or a subgroup's
  std::vector<std::string> names;
  std::vector<torch::Tensor> params;
  std::vector<int> owners;  // ZeRO-2: per parameter, the rank its gradient is reduced to
  std::vector<Bucket> buckets;
  // A bucket's parts, each reduced to one rank (to every rank: one part, root -1).
  struct Part {
    int root = -1;
    std::int64_t offset = 0;
    std::int64_t numel = 0;
  };
  std::vector<std::vector<Part>> parts;
  std::vector<std::string> waits;  // per bucket, "the all-reduce of gradient bucket 2"
  // Per parameter: its bucket and its offset in the bucket's flat buffer.
  std::vector<std::size_t> bucket_of;
  std::vector<std::int64_t> offset_of;
  std::vector<torch::Tensor> flat;  // one buffer per bucket (with owners: during a step only)
  std::vector<unsigned> hooks;      // per parameter, to remove them
  std::vector<std::vector<c10::intrusive_ptr<c10d::Work>>> work;  // per bucket, per part
  std::vector<std::size_t> pending;  // gradients still missing, per bucket
  std::vector<bool> ready;           // per parameter, this step
  std::string error;                 // a problem seen inside a hook, thrown by finish()
  std::mutex mutex;                  // hooks may run on autograd worker threads
  double comm_s = 0;
  std::atomic<std::uint64_t> bytes{0};
  // This step: when the first bucket's reduction started, when the last one finished.
  std::chrono::steady_clock::time_point first_launch;
  std::atomic<std::int64_t> last_done_ns{0};
  // Averaging over the whole world: the ranks' stop votes, exchanged once a step (StopVote).
  bool votes = false;
  torch::Tensor vote = torch::zeros({1}, torch::kInt);
  c10::intrusive_ptr<c10d::Work> vote_work;
  bool stop_agreed = false;

  Impl(World& w, Group& g) : world(w), group(g) {}

  bool sharded() const { return !owners.empty(); }

  void reset_step() {
    std::fill(ready.begin(), ready.end(), false);
    for (std::size_t b = 0; b < buckets.size(); ++b) pending[b] = buckets[b].params.size();
    work.assign(buckets.size(), {});
    error.clear();
    first_launch = {};
    last_done_ns = 0;
  }

  void on_gradient(std::size_t k, const torch::Tensor& grad) {
    std::lock_guard lock(mutex);
    if (ready[k]) {
      error = "parameter '" + names[k] +
              "' received two gradients in one backward (used twice in the forward); "
              "gradient sync needs each parameter used once per step";
      return;
    }
    ready[k] = true;
    const std::size_t b = bucket_of[k];
    if (!flat[b].defined()) flat[b] = torch::empty({buckets[b].numel}, params[k].options());
    flat[b].narrow(0, offset_of[k], grad.numel()).copy_(grad.reshape({-1}));
    if (--pending[b] == 0) {
      // Average as part of the reduction: divide first, then sum across ranks.
      flat[b].div_(group.getSize());
      if (b == 0 || first_launch == std::chrono::steady_clock::time_point{}) {
        first_launch = std::chrono::steady_clock::now();
      }
      for (const Part& part : parts[b]) {
        std::vector<torch::Tensor> tensors = {flat[b].narrow(0, part.offset, part.numel)};
        c10::intrusive_ptr<c10d::Work> w;
        if (part.root < 0) {
          w = group.allreduce(tensors);
        } else {
          c10d::ReduceOptions options;
          options.rootRank = part.root;
          w = group.reduce(tensors, options);
        }
        // Completion time, from the backend's thread: how long communication really took.
        w->getFuture()->addCallback([this](c10::ivalue::Future&) {
          const std::int64_t now =
              std::chrono::steady_clock::now().time_since_epoch().count();
          std::int64_t seen = last_done_ns.load();
          while (now > seen && !last_done_ns.compare_exchange_weak(seen, now)) {
          }
        });
        work[b].push_back(std::move(w));
      }
    }
  }
};

namespace {
// The device of a module's parameters (the CPU for none).
c10::Device parameters_device(const torch::nn::Module& model) {
  const std::vector<torch::Tensor> params = model.parameters();
  return params.empty() ? c10::Device(c10::DeviceType::CPU) : params.front().device();
}
}  // namespace

GradSync::GradSync(torch::nn::Module& model, World& world, Options options)
    : impl_(std::make_unique<Impl>(
          world, options.group ? *options.group : world.group_for(parameters_device(model)))) {
  Impl& s = *impl_;
  Group& group = s.group;
  std::size_t index = 0;
  for (const auto& item : model.named_parameters()) {
    if (options.selected.empty() || options.selected.at(index)) {
      s.names.push_back(item.key());
      s.params.push_back(item.value());
    }
    ++index;
  }
  if (s.params.empty()) throw Error("GradSync: no parameters selected");
  // A pipeline partition's replicas step with the other partitions, which do not vote.
  s.votes = options.group == nullptr;
  s.owners = std::move(options.owners);
  if (s.sharded() && s.owners.size() != s.params.size()) {
    throw Error("GradSync: " + std::to_string(s.owners.size()) + " owners for " +
                std::to_string(s.params.size()) + " parameters");
  }
  // Every rank starts from rank 0's weights and buffers.
  {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> state = s.params;
    for (const auto& buffer : model.buffers()) state.push_back(buffer);
    for (torch::Tensor& t : state) {
      std::vector<torch::Tensor> one = {t};
      group.broadcast(one)->wait();
    }
  }

  std::vector<std::int64_t> numels;
  for (const torch::Tensor& p : s.params) numels.push_back(p.numel());
  const std::int64_t element = static_cast<std::int64_t>(s.params.front().element_size());
  s.buckets = assign_buckets(numels, element, options.first_bucket_bytes, options.bucket_bytes);

  // The ranks must agree on the layout: compare a fingerprint of it across ranks.
  std::uint64_t hash = s.buckets.size();  // unsigned: overflow wraps, as a hash should
  for (const Bucket& b : s.buckets) {
    for (std::size_t k : b.params) {
      hash = hash * 1000003 + static_cast<std::uint64_t>(numels[k]) + 7 * k;
    }
    hash = hash * 31 + 1;  // bucket boundary
  }
  const auto fingerprint = static_cast<std::int64_t>(hash % 1000000007);
  torch::Tensor mine = torch::full({2}, fingerprint, torch::kLong);
  mine[1] = -fingerprint;
  std::vector<torch::Tensor> reduce = {mine};
  group.allreduce(reduce, c10d::AllreduceOptions{c10d::ReduceOp::MAX})->wait();
  if (mine[0].item<std::int64_t>() != fingerprint || -mine[1].item<std::int64_t>() != fingerprint) {
    throw Error("the ranks built different gradient buckets (their models differ): start every "
                "rank with the same config");
  }

  s.bucket_of.resize(s.params.size());
  s.offset_of.resize(s.params.size());
  for (std::size_t b = 0; b < s.buckets.size(); ++b) {
    // With owners each owner's parameters sit side by side, one part to reduce per owner.
    std::vector<Impl::Part>& parts = s.parts.emplace_back();
    std::int64_t offset = 0;
    for (int root = s.sharded() ? 0 : -1; root < (s.sharded() ? group.getSize() : 0); ++root) {
      Impl::Part part{root, offset, 0};
      for (std::size_t k : s.buckets[b].params) {
        if (s.sharded() && s.owners[k] != root) continue;
        s.bucket_of[k] = b;
        s.offset_of[k] = offset;
        offset += numels[k];
        part.numel += numels[k];
      }
      if (part.numel > 0) parts.push_back(part);
    }
    s.flat.push_back(s.sharded() ? torch::Tensor()
                                 : torch::zeros({s.buckets[b].numel}, s.params.front().options()));
    s.waits.push_back((s.sharded() ? "the reduce to its owners of gradient bucket "
                                   : "the all-reduce of gradient bucket ") +
                      std::to_string(b));
  }
  s.pending.resize(s.buckets.size());
  s.ready.resize(s.params.size());
  s.reset_step();
  for (std::size_t k = 0; k < s.params.size() && !options.accumulate; ++k) {
    Impl* impl = impl_.get();
    s.hooks.push_back(
        s.params[k].register_hook([impl, k](torch::Tensor grad) { impl->on_gradient(k, grad); }));
  }
  if (s.votes) world.stop_vote().hold();
}

GradSync::~GradSync() {
  if (impl_->votes) impl_->world.stop_vote().release();
  for (std::size_t k = 0; k < impl_->hooks.size(); ++k) {
    impl_->params[k].remove_hook(impl_->hooks[k]);
  }
}

void GradSync::reduce_accumulated() {
  Impl& s = *impl_;
  for (const Bucket& bucket : s.buckets) {
    for (const std::size_t k : bucket.params) {
      if (s.params[k].grad().defined()) s.on_gradient(k, s.params[k].grad());
    }
  }
}

void GradSync::end_backward() {
  Impl& s = *impl_;
  if (!s.error.empty()) {
    const std::string error = s.error;
    s.reset_step();
    throw Error(error);
  }
  for (std::size_t k = 0; k < s.params.size(); ++k) {
    if (!s.ready[k]) {
      // Its bucket never started; the other ranks would wait for it until the timeout.
      const std::string name = s.names[k];
      s.reset_step();
      throw Error("parameter '" + name +
                  "' got no gradient in this step (not used in the forward); gradient sync "
                  "needs every parameter to take part");
    }
  }
  if (s.votes) {  // behind the buckets' reductions, waited for by end_step
    s.vote.fill_(s.world.stop_vote().vote());
    std::vector<torch::Tensor> one = {s.vote};
    s.vote_work = s.world.group().allreduce(one, c10d::AllreduceOptions{c10d::ReduceOp::MAX});
  }
}

void GradSync::complete(std::size_t b) {
  Impl& s = *impl_;
  for (const c10::intrusive_ptr<c10d::Work>& w : s.work[b]) s.world.wait(*w, s.waits[b]);
  s.bytes += static_cast<std::uint64_t>(s.flat[b].numel() * s.flat[b].element_size());
  torch::NoGradGuard no_grad;
  for (const std::size_t k : s.buckets[b].params) {
    if (s.sharded() && s.owners[k] != s.group.getRank()) {
      s.params[k].mutable_grad().reset();  // another rank's optimizer shard updates it
      continue;
    }
    const torch::Tensor averaged =
        s.flat[b].narrow(0, s.offset_of[k], s.params[k].numel()).view_as(s.params[k]);
    s.params[k].mutable_grad().copy_(averaged);
  }
  if (s.sharded()) s.flat[b].reset();
}

void GradSync::end_step() {
  Impl& s = *impl_;
  if (s.vote_work) {
    s.world.wait(*s.vote_work, "the all-reduce of the ranks' stop votes");
    s.vote_work.reset();
    const int signal = s.vote.item<int>();
    if (signal != 0 && !s.stop_agreed) {
      s.stop_agreed = true;
      s.world.stop_vote().agreed(signal);
    }
  }
  const std::chrono::steady_clock::time_point last_done{
      std::chrono::steady_clock::duration(s.last_done_ns.load())};
  if (last_done > s.first_launch) {
    s.comm_s += std::chrono::duration<double>(last_done - s.first_launch).count();
  }
  s.reset_step();
}

const std::vector<Bucket>& GradSync::buckets() const { return impl_->buckets; }
bool GradSync::stop_agreed() const { return impl_->stop_agreed; }
double GradSync::comm_seconds() const { return impl_->comm_s; }
std::uint64_t GradSync::reduced_bytes() const { return impl_->bytes; }

std::int64_t GradSync::buffer_bytes() const {
  std::int64_t bytes = 0;
  for (const torch::Tensor& f : impl_->flat) {
    if (f.defined()) bytes += f.numel() * static_cast<std::int64_t>(f.element_size());
  }
  return bytes;
}

}  // namespace flowtrain::dist
