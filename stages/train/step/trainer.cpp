#include "stages/train/step/trainer.hpp"

#include <ATen/record_function.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <optional>
#include <set>

#include "distributed/grad_sync.hpp"
#include "distributed/sharding_plan.hpp"
#include "distributed/world.hpp"
#include "distributed/zero.hpp"
#include "graph/error.hpp"
#include "stages/train/models/compute.hpp"
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

// The optimizer state of the checkpoint whose rank `own_rank` file is `own`, as its
// `saved_shards` ranks wrote it under ZeRO (rank r's file: the moments of the parameters
// partition_parameters gave it), or whole in rank 0's file (0 shards), put into `optimizer`,
// which holds some of `named` (all of them, or this rank's shard): a run resumed with ZeRO
// turned on or off, or with ZeRO on another number of ranks.
void restore_resharded(const Checkpoint& own,
                       int own_rank,
                       std::uint64_t saved_shards,
                       const std::vector<std::pair<std::string, torch::Tensor>>& named,
                       const OptimizerOptions& options,
                       torch::optim::Optimizer& optimizer) {
  const std::string base = own.path.substr(0, own.path.size() - rank_file("", own_rank).size());
  std::vector<std::int64_t> numels;
  for (const auto& item : named) numels.push_back(item.second.numel());
  const int files = saved_shards > 0 ? static_cast<int>(saved_shards) : 1;
  const std::vector<int> owners = dist::partition_parameters(numels, files);
  std::set<std::string> held;  // the keys of optimizer.state(): its parameters' addresses
  for (const auto& group : optimizer.param_groups()) {
    for (const torch::Tensor& param : group.params()) {
      held.insert(c10::guts::to_string(param.unsafeGetTensorImpl()));
    }
  }
  for (int r = 0; r < files; ++r) {
    std::vector<std::pair<std::string, torch::Tensor>> shard;
    for (std::size_t k = 0; k < named.size(); ++k) {
      if (owners[k] == r) shard.push_back(named[k]);
    }
    // The shard's optimizer as rank r made it, over the same parameters, so the file's state
    // lands on them by position; then each entry goes to `optimizer` if it holds the parameter.
    const std::unique_ptr<torch::optim::AdamW> saved = make_adamw(shard, options);
    std::optional<Checkpoint> other;  // another rank's file; this rank's is read already
    load_optimizer(r == own_rank ? own : other.emplace(read_checkpoint(rank_file(base, r))),
                   *saved);
    for (auto& [key, state] : saved->state()) {
      if (held.count(key)) optimizer.state()[key] = std::move(state);
    }
  }
}

}  // namespace

Trainer::Trainer(const TrainerOptions& options,
                 dist::World* world,
                 const Checkpoint* resume_from)
    : options_(options) {
  check_options();
  build_model(resume_from);
  if (world) {
    rank_ = world->rank();
    world_size_ = world->size();
    world_ = world;
  }
  if (options_.partitioned.enabled()) build_partitions(world, resume_from);
  dist::ShardingPlan plan = build_optimizer(world);
  const bool partition_ranks = partitioned_ && partitioned_->across_ranks();
  const std::uint64_t partition_ranks_count =
      partition_ranks ? static_cast<std::uint64_t>(options_.partitioned.partitions) : 0;
  // How many optimizer shards there are: one per partition, or with ZeRO one per rank.
  const std::uint64_t shards =
      !zero_                ? 0
      : options_.zero > 0   ? static_cast<std::uint64_t>(world_size_)
                            : partition_ranks_count;
  if (options_.ema_decay > 0) {
    average_ = std::make_unique<WeightAverage>(model_, options_.ema_decay);
  }
  const bool average_restored =
      resume_from && resume(*resume_from, shards, partition_ranks_count);
  state_.world_size = static_cast<std::uint64_t>(world_size_);
  state_.zero_shards = shards;
  state_.partition_ranks = partition_ranks_count;
  if (partitioned_) state_.pipeline_splits = partitioned_->splits();
  if (world && (!partition_ranks || partitioned_->replicas())) start_grad_sync(*world, plan);
  // Averaging starts from the weights every rank starts from (a run resumed from a file that
  // did not average, from the restored ones).
  if (average_ && !average_restored) average_->reset(model_);
}

void Trainer::check_options() const {
  check_kd_loss_options(options_.loss);
  check_autocast(options_.autocast, options_.device);
  if (options_.device.is_cuda() && options_.partitioned.enabled()) {
    throw Error("param 'device': pipeline parallelism (partitions, microbatches) runs on the "
                "CPU only; use device: cpu, or partitions: 1 and microbatches: 1 on a GPU");
  }
}

void Trainer::build_model(const Checkpoint* resume_from) {
  const c10::Device& device = options_.device;
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
}

void Trainer::build_partitions(dist::World* world, const Checkpoint* resume_from) {
  const std::shared_ptr<ViTImpl> vit = std::dynamic_pointer_cast<ViTImpl>(model_.ptr());
  if (!vit) {
    throw Error("pipeline parallelism splits a ViT between its blocks; this model is " +
                model_->config().describe());
  }
  partitioned_ = std::make_unique<PartitionedModel>(
      options_.partitioned, ViT(vit), options_.autocast, options_.seed, options_.zero > 0,
      [this](const ModelOutput& forward, const torch::Tensor& teacher_logits,
             const torch::Tensor& labels, const torch::Tensor& targets, KdLoss& loss) {
        return loss_of(forward, teacher_logits, labels, targets, loss);
      },
      world, resume_from);
}

dist::ShardingPlan Trainer::build_optimizer(dist::World* world) {
  // Who keeps which parameter's optimizer state and gradient (distributed/sharding_plan.hpp).
  std::vector<std::int64_t> numels;
  for (const torch::Tensor& param : model_->parameters()) numels.push_back(param.numel());
  std::optional<dist::PartitionRanks> ranks;
  if (partitioned_ && partitioned_->across_ranks()) {
    ranks = dist::PartitionRanks{.partition_of = partitioned_->parameter_partitions(),
                                 .partition = partitioned_->partition(),
                                 .pipeline = partitioned_->partition_group(),
                                 .replicas = partitioned_->replicas()};
  }
  dist::ShardingPlan plan =
      dist::plan_sharding(numels, options_.zero, world, options_.device, ranks ? &*ranks : nullptr);
  grad_held_ = std::move(plan.grad_held);
  grad_group_ = plan.grad_group;
  if (!plan.levels.empty()) {
    zero_ = std::make_unique<dist::ShardedOptimizer>(
        named_parameters(model_), std::move(plan.levels),
        [this](const auto& shard) { return make_adamw(shard, options_.optimizer); }, world);
  } else {
    optimizer_ = make_adamw(model_, options_.optimizer);
  }
  return plan;
}

bool Trainer::resume(const Checkpoint& from, std::uint64_t shards, std::uint64_t partition_ranks) {
  const c10::Device& device = options_.device;
  const TrainState& saved = from.state;
  resumed_ranks_ = saved.world_size;
  const bool resized = saved.world_size != static_cast<std::uint64_t>(world_size_);
  // Pipeline partitions keep their own parameters' state, on their own ranks; ZeRO's shards
  // and plain data parallelism's copies can be re-split over any number of ranks.
  const bool pipelines = saved.partition_ranks > 0 || partition_ranks > 0;
  if (pipelines &&
      (resized || saved.partition_ranks != partition_ranks || saved.zero_shards != shards)) {
    throw Error(from.path + " was written by " + std::to_string(saved.world_size) +
                " rank(s)" + (saved.partition_ranks ? " as pipeline partitions" : "") +
                (saved.zero_shards > saved.partition_ranks ? " with ZeRO" : "") +
                "; pipeline partitions resume with the same number of ranks and partitions "
                "settings");
  }
  // The same shards: each rank's file holds its own state (unsharded: all of it, in the file
  // of rank 0 for a rank the job did not have). Other ones (zero turned on or off, ZeRO on
  // another number of ranks): the state is gathered from every rank's file and each rank
  // takes its part.
  const bool same_shards = saved.zero_shards == shards && (shards == 0 || !resized);
  ImageModel averaged = average_ ? average_->model() : ImageModel(nullptr);
  const bool average_restored =
      restore_training(from, model_, same_shards ? &optimizer() : nullptr,
                       average_ ? &averaged : nullptr, device);
  if (!same_shards) {
    const int own_rank = rank_ < static_cast<int>(saved.world_size) ? rank_ : 0;
    restore_resharded(from, own_rank, saved.zero_shards, named_parameters(model_),
                      options_.optimizer, optimizer());
  }
  if (device.is_cuda()) {  // a checkpoint loads on the CPU
    model_->to(device);
    if (average_restored) averaged->to(device);
    move_optimizer_state(optimizer(), device);
  }
  state_ = saved;
  if (scaler_ && saved.loss_scale > 0) {
    scaler_->restore(saved.loss_scale, static_cast<std::int64_t>(saved.loss_scale_growth));
  }
  return average_restored;
}

void Trainer::start_grad_sync(dist::World& world, dist::ShardingPlan& plan) {
  // After any restore: every rank starts from rank 0's weights. With pipelines, each
  // partition's gradients are averaged over its replicas once its micro-batches are done.
  const bool partition_ranks = partitioned_ && partitioned_->across_ranks();
  sync_ = std::make_unique<dist::GradSync>(
      *model_, world,
      dist::GradSync::Options{.first_bucket_bytes = options_.first_bucket_bytes,
                              .bucket_bytes = options_.bucket_bytes,
                              .owners = std::move(plan.sync_owners),
                              .group = partition_ranks ? partitioned_->replicas() : nullptr,
                              .selected = std::move(plan.sync_selected),
                              .accumulate = partition_ranks});
}

Trainer::~Trainer() = default;

torch::optim::AdamW& Trainer::optimizer() const { return zero_ ? zero_->local() : *optimizer_; }

StepOutcome Trainer::step(const data::Batch& batch) {
  const std::size_t buckets = forward_backward(batch);
  for (std::size_t b = 0; b < buckets; ++b) sync_bucket(b);
  return apply();
}

torch::Tensor Trainer::begin_step(const data::Batch& batch) {
  // Of a pipeline's ranks only the one holding the last stage computes the loss: the others
  // may get their batches without teacher outputs (teacher_infer's ranks_per_shard).
  const bool takes_loss = !partitioned_ || partitioned_->holds_loss();
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
  p.end_shared_position = batch.end_shared_position;
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
  if (partitioned_) {
    RECORD_USER_SCOPE("student pipeline");
    begin_partitioned_step(batch, /*as_tasks=*/false);
    partitioned_->run();  // each partition of this process on a thread of its own
    return end_partitioned_step();
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
  if (!partitioned_ || partitioned_->across_ranks()) {
    throw Error("begin_partitions: the model is not split into partitions of this process");
  }
  begin_partitioned_step(batch, /*as_tasks=*/true);
}

void Trainer::begin_partitioned_step(const data::Batch& batch, bool as_tasks) {
  const torch::Tensor labels = begin_step(batch);
  try {
    partitioned_->begin(batch, labels, as_tasks);
  } catch (...) {
    pending_.reset();
    throw;
  }
}

std::size_t Trainer::end_partitions() { return end_partitioned_step(); }

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

std::size_t Trainer::end_partitioned_step() {
  Pending& step = *pending_;
  PartitionedModel::Step done;
  try {
    done = partitioned_->end();
  } catch (...) {
    pending_.reset();
    throw;
  }
  step.out.loss = done.loss;
  step.out.correct = done.correct;
  step.out.bubble = done.bubble;
  step.out.peak_in_flight = done.peak_in_flight;
  step.out.peak_bytes = done.peak_bytes;
  step.out.timeline = std::move(done.timeline);
  step.loss = std::move(done.terms);
  if (sync_) sync_->reduce_accumulated();  // pipelines side by side: average over replicas
  clock_->mark(kForwardEnd);
  clock_->mark(kBackwardEnd);
  return end_step();
}

std::size_t Trainer::buckets_per_step() const { return sync_ ? sync_->buckets().size() : 1; }

bool Trainer::stopping() const { return sync_ && sync_->stop_agreed(); }

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
  state_.shared_data_position = p.end_shared_position;
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
