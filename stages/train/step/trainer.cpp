#include "stages/train/step/trainer.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/record_function.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <mutex>
#include <numeric>

#include "distributed/grad_sync.hpp"
#include "distributed/world.hpp"
#include "distributed/zero.hpp"
#include "graph/error.hpp"
#include "stages/train/models/compute.hpp"
#include "stages/train/partitioned/batch_runner.hpp"
#include "distributed/partition_link.hpp"
#include "stages/train/partitioned/thread_memory.hpp"
#include "stages/train/models/vit.hpp"

namespace flowtrain::train {

namespace {

std::string number(double v) {
  if (std::isnan(v)) return "nan";  // printf may say "-nan"
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

// Moves AdamW's moments to `device` (a checkpoint's optimizer state loads on the CPU).
void move_optimizer_state(torch::optim::AdamW& optimizer, const c10::Device& device) {
  for (auto& item : optimizer.state()) {
    auto& state = static_cast<torch::optim::AdamWParamState&>(*item.second);
    state.exp_avg(state.exp_avg().to(device));
    state.exp_avg_sq(state.exp_avg_sq().to(device));
    if (state.max_exp_avg_sq().defined()) state.max_exp_avg_sq(state.max_exp_avg_sq().to(device));
  }
}

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

}  // namespace

struct Trainer::Pipelined {
  PartitionSchedule schedule;
  std::vector<ModelStageFn> stages;
  std::vector<int> splits;        // block indices where the model's chunks begin
  std::vector<int> param_stages;  // [parameter]: the stage it belongs to
  // Across processes: this rank runs its partition, its tensors travel through the link to
  // the other ranks of its pipeline (`group`); with data parallelism too, `replicas` are the
  // ranks holding the same partition in the other pipelines.
  std::unique_ptr<PartitionLink> link;
  dist::Group* group = nullptr;
  dist::Group* replicas = nullptr;
  // The step's micro-batches, their loss weights (n_m / B), and what the last partition's loss
  // left of each; the batch's labels, to count its right predictions.
  std::vector<torch::Tensor> images, teacher_logits, labels, targets, logits;
  std::vector<double> weights;
  std::vector<KdLoss> losses;
  torch::Tensor batch_labels;
  std::unique_ptr<PartitionedBatch> running;  // the step in flight
  std::vector<double> waited_s;            // [partition]: over the finished steps
  std::mutex running_mutex;                // guards `running` against cancel_partitions
  std::string cancelled;                   // why the run failed (cancel_partitions)
};

Trainer::Trainer(const TrainerOptions& options,
                 dist::World* world,
                 const Checkpoint* resume_from)
    : options_(options) {
  if (options_.loss.alpha > 1) throw Error("param 'alpha' must be in [0, 1]");
  const c10::Device& device = options_.device;
  check_autocast(options_.autocast, device);
  if (device.is_cuda() && options_.pipeline.enabled()) {
    throw Error("param 'device': pipeline parallelism (partitions, microbatches) runs on the "
                "CPU only; use device: cpu, or partitions: 1 and microbatches: 1 on a GPU");
  }
  torch::manual_seed(options_.seed);
  model_ = make_model(options_.model);  // initialised on the CPU: the same weights anywhere
  if (!options_.init.path.empty() && !resume_from) {
    try {
      init_counts_ = init_weights(*model_, options_.init);
    } catch (const Error& e) {
      throw Error(std::string("param 'init': ") + e.what());
    }
  }
  if (device.is_cuda()) model_->to(device);
  clock_ = std::make_unique<WorkClock>(device);
  if (options_.autocast == c10::kHalf) scaler_ = std::make_unique<GradScaler>(options_.loss_scale);
  if (world) {
    rank_ = world->rank();
    world_size_ = world->size();
    world_ = world;
  }
  if (options_.pipeline.enabled()) build_pipeline(world, resume_from);
  const bool pipeline_ranks = pipelined_ && pipelined_->link;
  // What this rank's GradSync reduces: its partition's parameters with pipelines (empty: all),
  // and with ZeRO-2 to which rank of its group each of those goes (empty: to all).
  std::vector<bool> sync_selected;
  std::vector<int> sync_owners;
  if (pipeline_ranks || (options_.zero > 0 && world)) {
    // Sharded optimizer state: ZeRO's balanced shards over the ranks; with partitions on ranks
    // each rank keeps its partition's (with zero and pipelines side by side, its balanced share
    // of it among the partition's replicas) and updates those parameters; after each step the
    // other ranks get them. With ZeRO-2 a rank keeps only the gradients it updates with.
    std::vector<std::pair<std::string, torch::Tensor>> named;
    std::vector<std::int64_t> numels;
    for (const auto& item : model_->named_parameters()) {
      named.emplace_back(item.key(), item.value());
      numels.push_back(item.value().numel());
    }
    std::vector<dist::ShardedOptimizer::Level> levels;
    if (pipeline_ranks) {
      std::vector<int> partition_of;
      for (const int stage : pipelined_->param_stages) {
        partition_of.push_back(pipelined_->schedule.rank_of(stage));
      }
      const int me = pipelined_->link->rank();
      for (const int partition : partition_of) sync_selected.push_back(partition == me);
      grad_held_ = sync_selected;
      grad_group_ = pipelined_->group;
      if (options_.zero > 0) {
        std::vector<std::int64_t> mine;
        for (std::size_t k = 0; k < numels.size(); ++k) {
          if (sync_selected[k]) mine.push_back(numels[k]);
        }
        const int replica = pipelined_->replicas->getRank();
        const std::vector<int> shares =
            dist::partition_parameters(mine, pipelined_->replicas->getSize());
        std::vector<int> owners(numels.size(), -1);  // other partitions: not this level's
        for (std::size_t k = 0, i = 0; k < numels.size(); ++k) {
          if (!sync_selected[k]) continue;
          owners[k] = shares[i++];
          if (options_.zero >= 2) grad_held_[k] = owners[k] == replica;
        }
        if (options_.zero >= 2) {
          sync_owners = shares;
          grad_group_ = &world->group_for(device);  // each gradient now on one rank of all
        }
        levels.push_back({pipelined_->replicas, std::move(owners)});
      }
      levels.push_back({pipelined_->group, std::move(partition_of)});
    } else {
      levels.push_back(
          {&world->group_for(device), dist::partition_parameters(numels, world_size_)});
      if (options_.zero >= 2) {
        sync_owners = levels.back().owners;
        for (const int owner : sync_owners) grad_held_.push_back(owner == rank_);
        grad_group_ = &world->group_for(device);
      }
    }
    zero_ = std::make_unique<dist::ShardedOptimizer>(
        named, std::move(levels),
        [this](const auto& shard) { return make_adamw(shard, options_.optimizer); }, world);
  } else {
    optimizer_ = make_adamw(model_, options_.optimizer);
  }
  const std::uint64_t pipeline_ranks_count =
      pipeline_ranks ? static_cast<std::uint64_t>(options_.pipeline.partitions) : 0;
  // How many optimizer shards there are: one per partition, or with ZeRO one per rank.
  const std::uint64_t shards =
      !zero_                ? 0
      : options_.zero > 0   ? static_cast<std::uint64_t>(world_size_)
                            : pipeline_ranks_count;
  if (options_.ema_decay > 0) {
    average_ = std::make_unique<WeightAverage>(model_, options_.ema_decay);
  }
  bool average_restored = false;
  if (resume_from) {
    const TrainState& saved = resume_from->state;
    if (saved.world_size != static_cast<std::uint64_t>(world_size_) ||
        saved.zero_shards != shards || saved.pipeline_ranks != pipeline_ranks_count) {
      throw Error(resume_from->path + " was written by " + std::to_string(saved.world_size) +
                  " rank(s)" + (saved.pipeline_ranks ? " as pipeline partitions" : "") +
                  (saved.zero_shards > saved.pipeline_ranks ? " with ZeRO" : "") +
                  "; resume it with the same number of ranks, zero and partitions settings");
    }
    ImageModel averaged = average_ ? average_->model() : ImageModel(nullptr);
    average_restored = restore_training(*resume_from, model_, optimizer(),
                                        average_ ? &averaged : nullptr, device);
    if (device.is_cuda()) {  // a checkpoint loads on the CPU
      model_->to(device);
      if (average_restored) averaged->to(device);
      move_optimizer_state(optimizer(), device);
    }
    state_ = saved;
    resumed_ = true;
    if (scaler_ && saved.loss_scale > 0) {
      scaler_->restore(saved.loss_scale, static_cast<std::int64_t>(saved.loss_scale_growth));
    }
  }
  state_.world_size = static_cast<std::uint64_t>(world_size_);
  state_.zero_shards = shards;
  state_.pipeline_ranks = pipeline_ranks_count;
  if (pipelined_) state_.pipeline_splits = pipelined_->splits;
  if (world && (!pipeline_ranks || pipelined_->replicas)) {
    // After any restore: every rank starts from rank 0's weights. With pipelines, each
    // partition's gradients are averaged over its replicas once its micro-batches are done.
    sync_ = std::make_unique<dist::GradSync>(
        *model_, *world,
        dist::GradSync::Options{.first_bucket_bytes = options_.first_bucket_bytes,
                                .bucket_bytes = options_.bucket_bytes,
                                .owners = std::move(sync_owners),
                                .group = pipeline_ranks ? pipelined_->replicas : nullptr,
                                .selected = std::move(sync_selected),
                                .accumulate = pipeline_ranks});
  }
  // Averaging starts from the weights every rank starts from (a run resumed from a file that
  // did not average, from the restored ones).
  if (average_ && !average_restored) average_->reset(model_);
}

Trainer::~Trainer() = default;

std::vector<int> Trainer::pipeline_splits(ViT& vit,
                                          int stages,
                                          dist::World* world,
                                          const Checkpoint* resume_from) const {
  const PartitionOptions& o = options_.pipeline;
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
    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(options_.seed);
    const torch::Tensor probe = torch::randn(
        {8, config.channels, config.image_size, config.image_size}, generator, torch::kFloat);
    std::vector<double> costs;
    {
      Autocast autocast(options_.autocast);
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

void Trainer::build_pipeline(dist::World* world, const Checkpoint* resume_from) {
  const PartitionOptions& o = options_.pipeline;
  const ModelConfig& config = model_->config();
  const std::shared_ptr<ViTImpl> vit_impl = std::dynamic_pointer_cast<ViTImpl>(model_.ptr());
  if (!vit_impl) {
    throw Error("pipeline parallelism splits a ViT between its blocks; this model is " +
                config.describe());
  }
  const bool across_ranks = world && world->size() > 1;
  if (across_ranks && (o.partitions < 2 || world->size() % o.partitions != 0)) {
    throw Error("with " + std::to_string(world->size()) + " ranks, partitions (" +
                std::to_string(o.partitions) + ") must be 2 or more and divide the ranks: each " +
                "run of partitions consecutive ranks is a pipeline, and the pipelines are " +
                "data-parallel");
  }
  if (across_ranks && options_.zero > 0 && o.partitions == world->size()) {
    throw Error("zero with one pipeline across the ranks: each rank already keeps only its "
                "partition's optimizer state and gradients (zero shards them further among a "
                "partition's replicas, when the ranks are several pipelines)");
  }
  if (config.dropout > 0 || config.drop_path > 0) {
    // ATen's one CPU generator would serve the partitions' threads in an order that depends
    // on timing, and results must not.
    throw Error("pipeline parallelism needs dropout: 0 and drop_path: 0 (the partitions' "
                "random draws would depend on thread timing)");
  }
  // Each partition's peak memory is counted (thread_memory.hpp); installed now, while the graph
  // is still being built and no other thread allocates.
  install_memory_counting();
  auto p = std::make_unique<Pipelined>();
  p->schedule = make_partition_schedule(o.schedule, o.partitions, o.microbatches, o.virtual_stages);
  ViT vit(vit_impl);
  const std::vector<int> splits = pipeline_splits(vit, p->schedule.stages, world, resume_from);
  if (static_cast<int>(splits.size()) + 1 != p->schedule.stages) {
    throw Error(std::to_string(splits.size()) + " split points make " +
                std::to_string(splits.size() + 1) + " model chunks, but " +
                std::to_string(o.partitions) + " partitions x " +
                std::to_string(o.virtual_stages) + " virtual stages need " +
                std::to_string(p->schedule.stages));
  }
  Pipelined* pipelined = p.get();
  const c10::ScalarType autocast = options_.autocast;
  p->splits = splits;
  p->param_stages = vit_parameter_stages(vit, splits);
  if (across_ranks) {
    // Pipeline g is ranks g*P ... g*P + P-1; partition r's replicas are ranks r, r + P, ...
    const int P = o.partitions;
    const int first = world->rank() / P * P;
    if (P == world->size()) {
      p->group = &world->group();
    } else {
      std::vector<int> pipeline(static_cast<std::size_t>(P)), replicas;
      std::iota(pipeline.begin(), pipeline.end(), first);
      for (int r = world->rank() % P; r < world->size(); r += P) replicas.push_back(r);
      p->group = &world->subgroup(pipeline);  // every rank makes its pipeline's first
      p->replicas = &world->subgroup(replicas);
    }
    p->link = std::make_unique<PartitionLink>(*world, *p->group, first);
  }
  std::vector<ModelStageFn> stages = vit_model_stages(
      vit, splits, [this, pipelined](const ModelOutput& out, int m) {
        const auto i = static_cast<std::size_t>(m);
        NoAutocast float32;  // the loss as without a pipeline, outside the forward's autocast
        pipelined->logits[i] = loss_of(out, pipelined->teacher_logits[i], pipelined->labels[i],
                                       pipelined->targets[i], pipelined->losses[i]);
        return pipelined->losses[i].total;
      });
  for (ModelStageFn& stage : stages) {
    // Each partition's thread runs its forwards under the step's autocast.
    p->stages.push_back([stage, autocast](const torch::Tensor& x, int m) {
      Autocast scope(autocast);
      return stage(x, m);
    });
  }
  pipelined_ = std::move(p);
}

torch::optim::AdamW& Trainer::optimizer() const { return zero_ ? zero_->local() : *optimizer_; }

StepOutcome Trainer::step(const data::Batch& batch) {
  const std::size_t buckets = forward_backward(batch);
  for (std::size_t b = 0; b < buckets; ++b) sync_bucket(b);
  return apply();
}

torch::Tensor Trainer::begin_step(const data::Batch& batch) {
  // Of a pipeline's ranks only the one holding the last stage computes the loss: the others
  // may get their batches without teacher outputs (teacher_infer's ranks_per_shard).
  const bool takes_loss =
      !pipelined_ || !pipelined_->link ||
      pipelined_->schedule.rank_of(pipelined_->schedule.stages - 1) == pipelined_->link->rank();
  if (!batch.teacher_logits.defined() && options_.loss.alpha < 1 && takes_loss) {
    throw Error("batch " + std::to_string(batch.number) +
                " has no teacher outputs: put a teacher_infer stage before this one, or set "
                "alpha: 1 for supervised training");
  }
  if (!batch.teacher_logits.defined() && model_->config().distillation_token && takes_loss) {
    throw Error("batch " + std::to_string(batch.number) +
                " has no teacher outputs for the model's distillation token: put a "
                "teacher_infer stage before this one, or set distillation_token: false");
  }
  Pending& p = pending_.emplace();
  p.out.begin = clock_->start();
  p.out.batch_number = batch.number;
  p.end_position = batch.end_position;
  if (!batch.views.empty()) p.epoch = batch.views.back().epoch;
  p.out.seen = static_cast<std::uint64_t>(batch.size());
  model_->train();

  // Mixed rows (mixup): each row's label target is its own label and its partner's, by shares.
  if (!batch.label_mix.defined()) return batch.labels;
  const std::int64_t classes = model_->config().classes;
  const torch::Tensor own = batch.label_mix.to(torch::kFloat).unsqueeze(1);
  return torch::one_hot(batch.labels, classes).to(torch::kFloat) * own +
         torch::one_hot(batch.labels.index_select(0, batch.mix_partner), classes)
                 .to(torch::kFloat) *
             (1 - own);
}

std::size_t Trainer::end_step() {
  if (sync_) {
    try {
      sync_->end_backward();
    } catch (...) {
      pending_.reset();
      throw;
    }
  }
  return buckets_per_step();
}

std::size_t Trainer::forward_backward(const data::Batch& batch) {
  if (pipelined_) {
    RECORD_USER_SCOPE("student pipeline");
    begin_pipeline(batch, /*as_tasks=*/false);
    pipelined_->running->run();  // each partition of this process on a thread of its own
    return end_partitions();
  }
  batch.wait_copied();
  // The batch's tensors where the model is (themselves where they are there already).
  const c10::Device& device = options_.device;
  const auto here = [&device](const torch::Tensor& t) {
    return t.defined() ? t.to(device, /*non_blocking=*/true) : t;
  };
  const torch::Tensor labels = here(begin_step(batch));
  Pending& p = *pending_;
  {
    RECORD_USER_SCOPE("student forward");  // the parts' names in LibTorch's profiler
    ModelOutput forward;
    {
      Autocast autocast(options_.autocast, device.type());
      forward = model_->forward(here(batch.images));
    }
    const torch::Tensor logits =
        loss_of(forward, here(batch.teacher_logits), labels, here(batch.targets), p.loss);
    p.out.loss = p.loss.total.item<double>();
    // Counted now: the batch's pooled buffers may be reused once this call returns.
    p.out.correct = static_cast<std::uint64_t>(
        logits.argmax(1).eq(here(batch.labels)).sum().item<std::int64_t>());
  }
  clock_->mark(kForwardEnd);
  {
    RECORD_USER_SCOPE("student backward");
    model_->zero_grad();
    // Backward even for a non-finite loss: with data parallelism every rank must take part
    // in the gradient all-reduce, and the non-finite gradients then tell every rank to skip.
    // With float16 the loss is scaled first, so that small gradients stay representable.
    if (scaler_) {
      (p.loss.total * scaler_->scale()).backward();
    } else {
      p.loss.total.backward();
    }
  }
  clock_->mark(kBackwardEnd);
  return end_step();
}

void Trainer::begin_partitions(const data::Batch& batch) {
  if (!pipelined_ || pipelined_->link) {
    throw Error("begin_partitions: the model is not split into partitions of this process");
  }
  begin_pipeline(batch, /*as_tasks=*/true);
}

void Trainer::run_partition(int partition) { pipelined_->running->run_rank(partition); }

void Trainer::cancel_partitions(const std::string& reason) {
  if (!pipelined_) return;
  Pipelined& p = *pipelined_;
  std::lock_guard lock(p.running_mutex);
  if (p.cancelled.empty()) p.cancelled = reason;
  if (p.running) p.running->cancel(reason);
}

double Trainer::partition_wait_seconds(int partition) const {
  if (!pipelined_) return 0;
  const Pipelined& p = *pipelined_;
  const auto i = static_cast<std::size_t>(partition);
  return i < p.waited_s.size() ? p.waited_s[i] : 0;
}

torch::Tensor Trainer::loss_of(const ModelOutput& forward,
                               const torch::Tensor& teacher_logits,
                               const torch::Tensor& labels,
                               const torch::Tensor& targets,
                               KdLoss& loss) const {
  torch::Tensor logits = forward.logits.to(torch::kFloat);
  // The loss sees the regression at the head's own scale (order one), not the targets' units.
  const double scale = model_->config().regression_scale;
  const torch::Tensor regression = forward.regression.defined()
                                       ? forward.regression.to(torch::kFloat) / scale
                                       : torch::Tensor();
  const torch::Tensor scaled = regression.defined() ? targets / scale : torch::Tensor();
  const torch::Tensor distillation =
      forward.distillation.defined() ? forward.distillation.to(torch::kFloat) : torch::Tensor();
  if (teacher_logits.defined()) {
    loss = kd_loss(logits, teacher_logits, labels, options_.loss, regression, scaled,
                   distillation);
  } else {  // supervised: the labels alone (supervised_loss, with every regression option)
    KdLossOptions supervised = options_.loss;
    supervised.alpha = 1;
    loss = kd_loss(logits, teacher_logits, labels, supervised, regression, scaled);
  }
  return logits;
}

void Trainer::begin_pipeline(const data::Batch& batch, bool as_tasks) {
  const torch::Tensor labels = begin_step(batch);
  Pipelined& p = *pipelined_;
  const int m = p.schedule.microbatches;
  const std::int64_t size = batch.size();
  if (size < m) {
    pending_.reset();
    throw Error("batch " + std::to_string(batch.number) + " has " + std::to_string(size) +
                " samples, fewer than microbatches (" + std::to_string(m) + ")");
  }
  model_->zero_grad();  // every parameter's, not only this rank's optimizer shard's
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
  p.images = split(batch.images);
  p.teacher_logits = split(batch.teacher_logits);
  p.labels = split(labels.is_same(batch.labels) ? kept(labels) : labels);
  p.targets = split(kept(batch.targets));
  p.batch_labels = kept(batch.labels);
  p.losses.assign(static_cast<std::size_t>(m), {});
  p.logits.assign(static_cast<std::size_t>(m), {});
  p.weights.clear();
  for (const torch::Tensor& images : p.images) {
    p.weights.push_back(static_cast<double>(images.size(0)) / static_cast<double>(size));
  }
  if (p.link) p.link->set_batch(batch.number, sample_digest(batch));
  auto running = std::make_unique<PartitionedBatch>(
      p.schedule, p.stages, [&p](int i) { return p.images[static_cast<std::size_t>(i)]; },
      options_.pipeline.threads, p.weights, p.link.get(),
      as_tasks ? PartitionedBatch::Wait::kSuspend : PartitionedBatch::Wait::kBlock);
  std::lock_guard lock(p.running_mutex);
  // A run failing elsewhere may never start the other partitions' part of this step.
  if (!p.cancelled.empty()) running->cancel(p.cancelled);
  p.running = std::move(running);
}

std::size_t Trainer::end_partitions() {
  Pipelined& p = *pipelined_;
  Pending& step = *pending_;
  p.running->wait_ranks();
  std::unique_ptr<PartitionedBatch> done;
  {
    std::lock_guard lock(p.running_mutex);
    done = std::move(p.running);
  }
  p.waited_s.resize(p.schedule.actions.size(), 0.0);
  for (std::size_t r = 0; r < p.waited_s.size(); ++r) {
    p.waited_s[r] += done->waited_seconds(static_cast<int>(r));
  }
  PartitionedBatchResult r;
  try {
    r = done->finish();
  } catch (...) {
    pending_.reset();
    throw;
  }
  const std::vector<double>& weights = p.weights;
  step.out.loss = r.loss;
  step.out.bubble = r.bubble;
  step.out.peak_in_flight = *std::max_element(r.peak_in_flight.begin(), r.peak_in_flight.end());
  step.out.peak_bytes = *std::max_element(r.peak_bytes.begin(), r.peak_bytes.end());
  // Each rank's actions, on steady_clock seconds: [rank][i] = (start, end).
  std::vector<std::vector<std::pair<double, double>>> spans = r.spans;
  const double start_s = std::chrono::duration<double>(r.start.time_since_epoch()).count();
  for (auto& rank_spans : spans) {
    for (auto& [begin, end] : rank_spans) begin += start_s, end += start_s;
  }
  // The batch's loss terms, for a non-finite step's message: weighted sums, as the total.
  const auto weighted = [&](torch::Tensor KdLoss::*term) {
    torch::Tensor sum;
    for (std::size_t i = 0; i < weights.size(); ++i) {
      const torch::Tensor& t = p.losses[i].*term;
      if (!t.defined()) return torch::Tensor();
      sum = sum.defined() ? sum + t.detach() * weights[i] : t.detach() * weights[i];
    }
    return sum;
  };
  const bool has_loss = p.logits.front().defined();  // on the rank holding the last stage
  step.loss = {weighted(&KdLoss::total), weighted(&KdLoss::ce), weighted(&KdLoss::kd),
               weighted(&KdLoss::regression)};
  std::uint64_t correct = 0;
  if (has_loss) {
    correct = static_cast<std::uint64_t>(
        torch::cat(p.logits).argmax(1).eq(p.batch_labels).sum().item<std::int64_t>());
  }
  if (p.link) exchange_pipeline_step(has_loss, correct, spans, step);
  for (std::size_t rank = 0; rank < spans.size(); ++rank) {
    for (std::size_t i = 0; i < spans[rank].size(); ++i) {
      step.out.timeline.push_back(
          {.track = "partition " + std::to_string(rank),
           .label = describe_action(p.schedule, p.schedule.actions[rank][i]),
           .begin_s = spans[rank][i].first,
           .end_s = spans[rank][i].second});
    }
  }
  step.out.correct = correct;
  if (sync_) sync_->reduce_accumulated();  // pipelines side by side: average over replicas
  clock_->mark(kForwardEnd);
  clock_->mark(kBackwardEnd);
  return end_step();
}

void Trainer::exchange_pipeline_step(bool has_loss,
                                     std::uint64_t& correct,
                                     std::vector<std::vector<std::pair<double, double>>>& spans,
                                     Pending& step) {
  // Every rank gathers what the others know: the rank holding the last stage, the batch's loss
  // and accuracy; each rank, when its actions ran (for the chart and the bubble: one clock
  // on one machine, each rank's own across machines).
  Pipelined& p = *pipelined_;
  const double nan = std::nan("");
  const auto value = [&](const torch::Tensor& t) { return t.defined() ? t.item<double>() : nan; };
  const auto me = static_cast<std::size_t>(p.link->rank());
  const std::size_t actions = p.schedule.actions[me].size();
  torch::Tensor mine = torch::zeros({static_cast<std::int64_t>(4 + 2 * actions)}, torch::kDouble);
  double* v = mine.data_ptr<double>();
  if (has_loss) {
    v[0] = step.out.loss;
    v[1] = static_cast<double>(correct);
    v[2] = value(step.loss.ce);
    v[3] = value(step.loss.kd);
  }
  for (std::size_t i = 0; i < actions; ++i) {
    v[4 + 2 * i] = spans[me][i].first;
    v[5 + 2 * i] = spans[me][i].second;
  }
  std::vector<std::vector<torch::Tensor>> all(1);
  for (int r = 0; r < p.group->getSize(); ++r) all[0].push_back(torch::empty_like(mine));
  std::vector<torch::Tensor> input = {mine};
  world_->wait(*p.group->allgather(all, input), "the pipeline step's exchange");
  const double* last = all[0][static_cast<std::size_t>(
                                  p.schedule.rank_of(p.schedule.stages - 1))]
                           .data_ptr<double>();
  step.out.loss = last[0];
  correct = static_cast<std::uint64_t>(last[1]);
  step.loss = {torch::tensor(last[0]), torch::tensor(last[2]),
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
  step.out.bubble = wall > 0 ? 1 - busy / (static_cast<double>(spans.size()) * wall) : 0;
}

std::size_t Trainer::buckets_per_step() const { return sync_ ? sync_->buckets().size() : 1; }

void Trainer::sync_bucket(std::size_t b) {
  if (sync_) sync_->complete(b);
}

StepOutcome Trainer::apply() {
  if (!pending_) throw Error("Trainer::apply without a step in flight (call forward_backward)");
  Pending p = std::move(*pending_);
  pending_.reset();
  StepOutcome& out = p.out;
  if (sync_) sync_->end_step();
  clock_->mark(kSyncEnd);
  RECORD_USER_SCOPE("optimizer");
  const std::uint64_t step = state_.step + 1;
  if (scaler_) scaler_->unscale(model_->parameters());
  const double clip = options_.clip_grad_norm;
  const double grad_norm =
      !grad_held_.empty()
          ? clip_sharded_gradients(clip > 0 ? clip : INFINITY)
          : torch::nn::utils::clip_grad_norm_(model_->parameters(), clip > 0 ? clip : INFINITY);

  state_.data_position = p.end_position;
  if (p.epoch) state_.epoch = *p.epoch;
  if (scaler_ && !std::isfinite(grad_norm)) {
    // The loss scale was too high for float16: skip the step and back off, as GradScaler.
    scaler_->update(/*found_inf=*/true);
    model_->zero_grad();
    ++state_.skipped_steps;
    return finish(out);
  }
  if (!std::isfinite(out.loss) || !std::isfinite(grad_norm)) {
    std::string what = "step " + std::to_string(step) + " (batch " +
                       std::to_string(out.batch_number) + "): " +
                       (std::isfinite(out.loss) ? "gradient norm is " + number(grad_norm)
                                                : "loss is " + number(out.loss)) +
                       " (cross-entropy " + number(p.loss.ce.item<double>());
    if (p.loss.kd.defined()) what += ", distillation " + number(p.loss.kd.item<double>());
    what += ")";
    if (!options_.skip_nonfinite) {
      throw Error(what + "; lower lr, or set on_nonfinite: skip to skip such steps");
    }
    model_->zero_grad();
    ++state_.skipped_steps;
    return finish(out);
  }

  out.lr = scheduled_lr(options_.optimizer, state_.step, state_.total_steps);
  set_lr(optimizer(), out.lr);
  if (zero_) {
    zero_->step();
  } else {
    optimizer_->step();
  }
  if (average_) average_->update(model_, step);
  if (scaler_) scaler_->update(/*found_inf=*/false);
  state_.step = step;
  out.applied = true;
  return finish(out);
}

StepOutcome& Trainer::finish(StepOutcome& out) {
  clock_->mark(kEnd);
  const std::array<WorkClock::Clock::time_point, WorkClock::kMarks> ends = clock_->finish();
  out.forward_end = ends[kForwardEnd];
  out.backward_end = ends[kBackwardEnd];
  out.sync_end = ends[kSyncEnd];
  out.end = ends[kEnd];
  return out;
}

double Trainer::clip_sharded_gradients(double max_norm) {
  const std::vector<torch::Tensor> params = model_->parameters();
  // Each parameter's gradient norm, on the rank that holds it (0 elsewhere, so the sum is
  // exact); then the steps of clip_grad_norm_ on the whole list.
  std::vector<torch::Tensor> norms;
  for (std::size_t k = 0; k < params.size(); ++k) {
    const torch::Tensor& grad = params[k].grad();
    const bool mine = grad_held_[k];
    if (grad.defined() != mine) {
      throw Error("rank " + std::to_string(rank_) + ": parameter " + std::to_string(k) +
                  (mine ? " of its shard got no gradient" : " of another rank's shard got one"));
    }
    norms.push_back(mine ? grad.norm(2) : torch::zeros({}, params[k].options()));
  }
  std::vector<torch::Tensor> buffer = {torch::stack(norms)};
  world_->wait(*grad_group_->allreduce(buffer), "the gradient norm's all-reduce");
  const torch::Tensor total = buffer.front().norm(2);
  const torch::Tensor coefficient = torch::clamp(max_norm / (total + 1e-6), c10::nullopt, 1.0);
  for (const torch::Tensor& param : params) {
    if (param.grad().defined()) param.grad().data().mul_(coefficient);
  }
  return total.item<double>();
}

std::string Trainer::checkpoint(bool with_optimizer) const {
  const ImageModel averaged = average_ ? average_->model() : ImageModel(nullptr);
  TrainState state = state_;
  if (scaler_) {  // the scaler's own state, as it is now
    state.loss_scale = scaler_->scale();
    state.loss_scale_growth = static_cast<std::uint64_t>(scaler_->growth_tracker());
  }
  return checkpoint_bytes(model_, with_optimizer ? &optimizer() : nullptr, state,
                          average_ ? &averaged : nullptr, options_.device);
}

double Trainer::sync_comm_seconds() const { return sync_ ? sync_->comm_seconds() : 0; }

std::int64_t Trainer::optimizer_state_bytes() const {
  return dist::optimizer_state_bytes(optimizer());
}

std::int64_t Trainer::gradient_bytes() const {
  std::int64_t bytes = sync_ ? sync_->buffer_bytes() : 0;
  for (const torch::Tensor& p : model_->parameters()) {
    if (p.grad().defined()) bytes += p.grad().numel() * static_cast<std::int64_t>(p.element_size());
  }
  return bytes;
}

}  // namespace flowtrain::train
