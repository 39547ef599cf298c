#include "stages/train/partitioned/partitioned_model.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <numeric>

#include "distributed/partition_link.hpp"
#include "distributed/world.hpp"
#include "graph/error.hpp"
#include "stages/train/files/checkpoint.hpp"
#include "stages/train/models/compute.hpp"
#include "stages/train/partitioned/batch_runner.hpp"
#include "stages/train/partitioned/thread_memory.hpp"

namespace flowtrain::train {

namespace {

// Which samples a batch holds (FNV-1a over their views, else their labels), as a non-negative
// int64: the ranks of a pipeline must agree on it.
std::uint64_t sample_digest(const data::Batch& batch) {
  std::uint64_t digest = 14695981039346656037ull;
  const auto mix = [&digest](std::uint64_t v) { digest = (digest ^ v) * 1099511628211ull; };
  for (const data::ViewKey& view : batch.views) {
    mix(view.index);
    mix(view.epoch);
  }
  if (batch.views.empty()) {
    const torch::Tensor labels = batch.labels.contiguous();
    const std::int64_t* label = labels.data_ptr<std::int64_t>();
    for (std::int64_t i = 0; i < labels.numel(); ++i) mix(static_cast<std::uint64_t>(label[i]));
  }
  return digest >> 1;
}

// Where to split the model: the given splits, else the checkpoint's or measured ones
// (measured_balance), else as equal a count of blocks as they divide.
std::vector<int> split_points(const PartitionOptions& o,
                              ViT& vit,
                              int stages,
                              c10::ScalarType autocast,
                              std::uint64_t seed,
                              dist::World* world,
                              const Checkpoint* resume_from) {
  if (!o.splits.empty()) return o.splits;
  if (!o.measured_balance) return balanced_splits(vit->config().depth, stages);
  if (resume_from && !resume_from->state.pipeline_splits.empty()) {
    return resume_from->state.pipeline_splits;  // each rank's optimizer state follows them
  }
  torch::Tensor splits;
  if (!world || world->rank() == 0) {
    // A probe micro-batch of 8 images from a generator of its own (training's draws must not
    // depend on it); the costs scale alike with the batch.
    const ModelConfig& config = vit->config();
    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
    const torch::Tensor probe = torch::randn(
        {8, config.channels, config.image_size, config.image_size}, generator, torch::kFloat);
    std::vector<double> costs;
    {
      Autocast scope(autocast);
      costs = piece_seconds(*vit, probe, /*backward=*/true);
    }
    for (torch::Tensor& p : vit->parameters()) p.mutable_grad().reset();  // as never trained
    const std::vector<int> measured = measured_splits(costs, stages);
    splits = torch::tensor(std::vector<std::int64_t>(measured.begin(), measured.end()));
  } else {
    splits = torch::zeros({stages - 1}, torch::kLong);
  }
  if (world) {  // every rank splits where rank 0 measured
    std::vector<torch::Tensor> one = {splits};
    world->wait(*world->group().broadcast(one), "the broadcast of the measured pipeline splits");
  }
  std::vector<int> out;
  for (std::int64_t i = 0; i < splits.numel(); ++i) {
    out.push_back(static_cast<int>(splits[i].item<std::int64_t>()));
  }
  return out;
}

}  // namespace

struct PartitionedModel::Running {
  std::mutex mutex;
  std::unique_ptr<PartitionedBatch> batch;  // the step in flight
  std::string cancelled;                    // why the run failed (cancel)
};

PartitionedModel::PartitionedModel(const PartitionOptions& options,
                                   ViT vit,
                                   c10::ScalarType autocast,
                                   std::uint64_t seed,
                                   bool zero,
                                   LossFn loss,
                                   dist::World* world,
                                   const Checkpoint* resume_from)
    : options_(options),
      vit_(std::move(vit)),
      world_(world),
      running_(std::make_unique<Running>()) {
  const PartitionOptions& o = options_;
  const ModelConfig& config = vit_->config();
  const bool across_ranks = world && world->size() > 1;
  if (across_ranks && (o.partitions < 2 || world->size() % o.partitions != 0)) {
    throw Error("with " + std::to_string(world->size()) + " ranks, partitions (" +
                std::to_string(o.partitions) + ") must be 2 or more and divide the ranks: each " +
                "run of partitions consecutive ranks is a pipeline, and the pipelines are " +
                "data-parallel");
  }
  if (across_ranks && zero && o.partitions == world->size()) {
    throw Error(
        "zero with one pipeline across the ranks: each rank already keeps only its "
        "partition's optimizer state and gradients (zero shards them further among a "
        "partition's replicas, when the ranks are several pipelines)");
  }
  if (config.dropout > 0 || config.drop_path > 0) {
    // ATen's one CPU generator would serve the partitions' threads in an order that depends
    // on timing, and results must not.
    throw Error(
        "pipeline parallelism needs dropout: 0 and drop_path: 0 (the partitions' "
        "random draws would depend on thread timing)");
  }
  // Each partition's peak memory is counted (thread_memory.hpp); installed now, while the graph
  // is still being built and no other thread allocates.
  install_memory_counting();
  schedule_ =
      make_partition_schedule(o.schedule, o.partitions, o.microbatches, o.chunks_per_partition);
  splits_ = split_points(o, vit_, schedule_.stages, autocast, seed, world, resume_from);
  if (static_cast<int>(splits_.size()) + 1 != schedule_.stages) {
    throw Error(std::to_string(splits_.size()) + " split points make " +
                std::to_string(splits_.size() + 1) + " model chunks, but " +
                std::to_string(o.partitions) + " partitions x " +
                std::to_string(o.chunks_per_partition) + " chunks per partition need " +
                std::to_string(schedule_.stages));
  }
  param_stages_ = vit_parameter_stages(vit_, splits_);
  if (across_ranks) {
    // Pipeline g is ranks g*P ... g*P + P-1; partition r's replicas are ranks r, r + P, ...
    const int P = o.partitions;
    const int first = world->rank() / P * P;
    if (P == world->size()) {
      group_ = &world->group();
    } else {
      std::vector<int> pipeline(static_cast<std::size_t>(P)), replicas;
      std::iota(pipeline.begin(), pipeline.end(), first);
      for (int r = world->rank() % P; r < world->size(); r += P) replicas.push_back(r);
      group_ = &world->subgroup(pipeline);  // every rank makes its pipeline's first
      replicas_ = &world->subgroup(replicas);
    }
    link_ = std::make_unique<dist::PartitionLink>(*world, *group_, first);
  }
  std::vector<ModelStageFn> stages = vit_model_stages(
      vit_, splits_, [this, loss = std::move(loss)](const ModelOutput& out, int m) {
        const auto i = static_cast<std::size_t>(m);
        NoAutocast float32;  // the loss as without partitions, outside the forward's autocast
        logits_[i] = loss(out, teacher_logits_[i], labels_[i], targets_[i], losses_[i]);
        return losses_[i].total;
      });
  for (ModelStageFn& stage : stages) {
    // Each partition's thread runs its forwards under the step's autocast.
    stages_.push_back([stage, autocast](const torch::Tensor& x, int m) {
      Autocast scope(autocast);
      return stage(x, m);
    });
  }
}

PartitionedModel::~PartitionedModel() = default;

std::vector<int> PartitionedModel::parameter_partitions() const {
  std::vector<int> partition_of;
  for (const int stage : param_stages_) partition_of.push_back(schedule_.rank_of(stage));
  return partition_of;
}

int PartitionedModel::partition() const { return link_ ? link_->rank() : 0; }

bool PartitionedModel::holds_loss() const {
  return !link_ || schedule_.rank_of(schedule_.stages - 1) == link_->rank();
}

void PartitionedModel::begin(const data::Batch& batch, const torch::Tensor& labels, bool as_tasks) {
  const int m = schedule_.microbatches;
  const std::int64_t size = batch.size();
  if (size < m) {
    throw Error("batch " + std::to_string(batch.number) + " has " + std::to_string(size) +
                " samples, fewer than microbatches (" + std::to_string(m) + ")");
  }
  vit_->zero_grad();  // every parameter's, not only this rank's optimizer shard's
  const auto split = [m](const torch::Tensor& t) {
    return t.defined() ? t.tensor_split(m)
                       : std::vector<torch::Tensor>(static_cast<std::size_t>(m));
  };
  // As tasks, the partition nodes outlive the entry's call, which holds the batch: only the
  // first stage reads the images, and it is done with them when that call returns, but the
  // last stage's targets and the labels are read later, so they are copied out of the batch's
  // pooled buffers (a few values a row). On threads the batch outlives the step.
  const auto kept = [as_tasks](const torch::Tensor& t) {
    return as_tasks && t.defined() ? t.clone() : t;
  };
  images_ = split(batch.images);
  teacher_logits_ = split(batch.teacher_logits);
  labels_ = split(labels.is_same(batch.labels) ? kept(labels) : labels);
  targets_ = split(kept(batch.targets));
  batch_labels_ = kept(batch.labels);
  losses_.assign(static_cast<std::size_t>(m), {});
  logits_.assign(static_cast<std::size_t>(m), {});
  weights_.clear();
  for (const torch::Tensor& images : images_) {
    weights_.push_back(static_cast<double>(images.size(0)) / static_cast<double>(size));
  }
  if (link_) link_->set_batch(batch.number, sample_digest(batch));
  auto running = std::make_unique<PartitionedBatch>(
      schedule_, stages_, [this](int i) { return images_[static_cast<std::size_t>(i)]; },
      options_.threads, weights_, link_.get(),
      as_tasks ? PartitionedBatch::Wait::kSuspend : PartitionedBatch::Wait::kBlock);
  std::lock_guard lock(running_->mutex);
  // A run failing elsewhere may never start the other partitions' part of this step.
  if (!running_->cancelled.empty()) running->cancel(running_->cancelled);
  running_->batch = std::move(running);
}

void PartitionedModel::run() { running_->batch->run(); }

void PartitionedModel::run_partition(int partition) { running_->batch->run_rank(partition); }

void PartitionedModel::cancel(const std::string& reason) {
  std::lock_guard lock(running_->mutex);
  if (running_->cancelled.empty()) running_->cancelled = reason;
  if (running_->batch) running_->batch->cancel(reason);
}

double PartitionedModel::wait_seconds(int partition) const {
  const auto i = static_cast<std::size_t>(partition);
  return i < waited_s_.size() ? waited_s_[i] : 0;
}

PartitionedModel::Step PartitionedModel::end() {
  running_->batch->wait_ranks();
  std::unique_ptr<PartitionedBatch> done;
  {
    std::lock_guard lock(running_->mutex);
    done = std::move(running_->batch);
  }
  waited_s_.resize(schedule_.actions.size(), 0.0);
  for (std::size_t r = 0; r < waited_s_.size(); ++r) {
    waited_s_[r] += done->waited_seconds(static_cast<int>(r));
  }
  const PartitionedBatchResult r = done->finish();
  Step step;
  step.loss = r.loss;
  step.bubble = r.bubble;
  step.peak_in_flight = *std::max_element(r.peak_in_flight.begin(), r.peak_in_flight.end());
  step.peak_bytes = *std::max_element(r.peak_bytes.begin(), r.peak_bytes.end());
  // Each rank's actions, on steady_clock seconds: [rank][i] = (start, end).
  std::vector<std::vector<std::pair<double, double>>> spans = r.spans;
  const double start_s = std::chrono::duration<double>(r.start.time_since_epoch()).count();
  for (auto& rank_spans : spans) {
    for (auto& [begin, end] : rank_spans) begin += start_s, end += start_s;
  }
  // The batch's loss terms, for a non-finite step's message: weighted sums, as the total.
  const auto weighted = [&](torch::Tensor KdLoss::*term) {
    torch::Tensor sum;
    for (std::size_t i = 0; i < weights_.size(); ++i) {
      const torch::Tensor& t = losses_[i].*term;
      if (!t.defined()) return torch::Tensor();
      sum = sum.defined() ? sum + t.detach() * weights_[i] : t.detach() * weights_[i];
    }
    return sum;
  };
  const bool has_loss = logits_.front().defined();  // on the rank holding the last stage
  step.terms = {weighted(&KdLoss::total), weighted(&KdLoss::ce), weighted(&KdLoss::kd),
                weighted(&KdLoss::regression)};
  if (has_loss) {
    step.correct = static_cast<std::uint64_t>(
        torch::cat(logits_).argmax(1).eq(batch_labels_).sum().item<std::int64_t>());
  }
  if (link_) exchange(has_loss, spans, step);
  for (std::size_t rank = 0; rank < spans.size(); ++rank) {
    for (std::size_t i = 0; i < spans[rank].size(); ++i) {
      step.timeline.push_back({.track = "partition " + std::to_string(rank),
                               .label = describe_action(schedule_, schedule_.actions[rank][i]),
                               .begin_s = spans[rank][i].first,
                               .end_s = spans[rank][i].second});
    }
  }
  return step;
}

void PartitionedModel::exchange(bool has_loss,
                                std::vector<std::vector<std::pair<double, double>>>& spans,
                                Step& step) {
  // Every rank gathers what the others know: the rank holding the last stage, the batch's loss
  // and accuracy; each rank, when its actions ran (for the chart and the bubble: one clock
  // on one machine, each rank's own across machines).
  const double nan = std::nan("");
  const auto value = [&](const torch::Tensor& t) { return t.defined() ? t.item<double>() : nan; };
  const auto me = static_cast<std::size_t>(link_->rank());
  const std::size_t actions = schedule_.actions[me].size();
  torch::Tensor mine = torch::zeros({static_cast<std::int64_t>(4 + 2 * actions)}, torch::kDouble);
  double* v = mine.data_ptr<double>();
  if (has_loss) {
    v[0] = step.loss;
    v[1] = static_cast<double>(step.correct);
    v[2] = value(step.terms.ce);
    v[3] = value(step.terms.kd);
  }
  for (std::size_t i = 0; i < actions; ++i) {
    v[4 + 2 * i] = spans[me][i].first;
    v[5 + 2 * i] = spans[me][i].second;
  }
  std::vector<std::vector<torch::Tensor>> all(1);
  for (int r = 0; r < group_->getSize(); ++r) all[0].push_back(torch::empty_like(mine));
  std::vector<torch::Tensor> input = {mine};
  world_->wait(*group_->allgather(all, input), "the pipeline step's exchange");
  const double* last =
      all[0][static_cast<std::size_t>(schedule_.rank_of(schedule_.stages - 1))].data_ptr<double>();
  step.loss = last[0];
  step.correct = static_cast<std::uint64_t>(last[1]);
  step.terms = {torch::tensor(last[0]), torch::tensor(last[2]),
                std::isnan(last[3]) ? torch::Tensor() : torch::tensor(last[3]), torch::Tensor()};
  double begin = INFINITY, end = -INFINITY, busy = 0;
  for (std::size_t r = 0; r < spans.size(); ++r) {
    const double* theirs = all[0][r].data_ptr<double>();
    spans[r].resize(actions);
    for (std::size_t i = 0; i < actions; ++i) {
      spans[r][i] = {theirs[4 + 2 * i], theirs[5 + 2 * i]};
      begin = std::min(begin, spans[r][i].first);
      end = std::max(end, spans[r][i].second);
      busy += spans[r][i].second - spans[r][i].first;
    }
  }
  const double wall = end - begin;
  step.bubble = wall > 0 ? 1 - busy / (static_cast<double>(spans.size()) * wall) : 0;
}

}  // namespace flowtrain::train
