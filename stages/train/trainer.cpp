#include "stages/train/trainer.hpp"

#include <ATen/record_function.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>

#include "distributed/grad_sync.hpp"
#include "distributed/world.hpp"
#include "distributed/zero.hpp"
#include "graph/error.hpp"
#include "stages/train/compute.hpp"
#include "stages/train/pipeline.hpp"
#include "stages/train/vit.hpp"

namespace flowtrain::train {

namespace {

std::string number(double v) {
  if (std::isnan(v)) return "nan";  // printf may say "-nan"
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

}  // namespace

struct Trainer::Pipelined {
  PipelineSchedule schedule;
  std::vector<PipelineStageFn> stages;
  // The step's micro-batches, and what the last partition's loss left of each.
  std::vector<torch::Tensor> images, teacher_logits, labels, targets, logits;
  std::vector<KdLoss> losses;
};

Trainer::Trainer(const TrainerOptions& options,
                 dist::World* world,
                 const Checkpoint* resume_from)
    : options_(options) {
  if (options_.loss.alpha > 1) throw Error("param 'alpha' must be in [0, 1]");
  torch::manual_seed(options_.seed);
  model_ = make_model(options_.model);
  if (world) {
    rank_ = world->rank();
    world_size_ = world->size();
  }
  if (options_.zero && world) {
    std::vector<std::pair<std::string, torch::Tensor>> named;
    for (const auto& item : model_->named_parameters()) named.emplace_back(item.key(), item.value());
    zero_ = std::make_unique<dist::ShardedOptimizer>(
        named, world->group(),
        [this](const auto& shard) { return make_adamw(shard, options_.optimizer); });
  } else {
    optimizer_ = make_adamw(model_, options_.optimizer);
  }
  if (resume_from) {
    const TrainState& saved = resume_from->state;
    if (saved.world_size != static_cast<std::uint64_t>(world_size_) ||
        saved.zero_shards != (zero_ ? saved.world_size : 0)) {
      throw Error(resume_from->path + " was written by " + std::to_string(saved.world_size) +
                  " rank(s)" + (saved.zero_shards ? " with ZeRO" : "") +
                  "; resume it with the same number of ranks and the same zero setting");
    }
    restore_training(*resume_from, model_, optimizer());
    state_ = saved;
    resumed_ = true;
  }
  state_.world_size = static_cast<std::uint64_t>(world_size_);
  state_.zero_shards = zero_ ? static_cast<std::uint64_t>(world_size_) : 0;
  if (options_.pipeline.enabled()) build_pipeline(world != nullptr);
  if (world) {
    // After any restore: every rank starts from rank 0's weights.
    sync_ = std::make_unique<dist::GradSync>(
        *model_, *world,
        dist::GradSync::Options{.first_bucket_bytes = options_.first_bucket_bytes,
                                .bucket_bytes = options_.bucket_bytes});
  }
}

Trainer::~Trainer() = default;

void Trainer::build_pipeline(bool data_parallel) {
  const PipelineOptions& o = options_.pipeline;
  const ModelConfig& config = model_->config();
  const std::shared_ptr<ViTImpl> vit_impl = std::dynamic_pointer_cast<ViTImpl>(model_.ptr());
  if (!vit_impl) {
    throw Error("pipeline parallelism splits a ViT between its blocks; this model is " +
                config.describe());
  }
  if (data_parallel) {
    throw Error("pipeline parallelism runs within one process for now: with several ranks, "
                "set partitions: 1 and microbatches: 1");
  }
  if (config.dropout > 0 || config.drop_path > 0) {
    // ATen's one CPU generator would serve the partitions' threads in an order that depends
    // on timing, and results must not.
    throw Error("pipeline parallelism needs dropout: 0 and drop_path: 0 (the partitions' "
                "random draws would depend on thread timing)");
  }
  auto p = std::make_unique<Pipelined>();
  p->schedule = make_pipeline_schedule(o.schedule, o.partitions, o.microbatches, o.virtual_stages);
  const std::vector<int> splits =
      o.splits.empty() ? balanced_splits(config.depth, p->schedule.stages) : o.splits;
  if (static_cast<int>(splits.size()) + 1 != p->schedule.stages) {
    throw Error(std::to_string(splits.size()) + " split points make " +
                std::to_string(splits.size() + 1) + " model chunks, but " +
                std::to_string(o.partitions) + " partitions x " +
                std::to_string(o.virtual_stages) + " virtual stages need " +
                std::to_string(p->schedule.stages));
  }
  Pipelined* pipelined = p.get();
  const bool bf16 = options_.bf16;
  ViT vit(vit_impl);
  std::vector<PipelineStageFn> stages = vit_pipeline_stages(
      vit, splits, [this, pipelined](const ModelOutput& out, int m) {
        const auto i = static_cast<std::size_t>(m);
        NoAutocast float32;  // the loss as without a pipeline, outside the forward's autocast
        pipelined->logits[i] = loss_of(out, pipelined->teacher_logits[i], pipelined->labels[i],
                                       pipelined->targets[i], pipelined->losses[i]);
        return pipelined->losses[i].total;
      });
  for (PipelineStageFn& stage : stages) {
    // Each partition's thread runs its forwards under the step's autocast.
    p->stages.push_back([stage, bf16](const torch::Tensor& x, int m) {
      Autocast autocast(bf16);
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

std::size_t Trainer::forward_backward(const data::Batch& batch) {
  if (!batch.teacher_logits.defined() && options_.loss.alpha < 1) {
    throw Error("batch " + std::to_string(batch.number) +
                " has no teacher outputs: put a teacher_infer stage before this one, or set "
                "alpha: 1 for supervised training");
  }
  if (!batch.teacher_logits.defined() && model_->config().distillation_token) {
    throw Error("batch " + std::to_string(batch.number) +
                " has no teacher outputs for the model's distillation token: put a "
                "teacher_infer stage before this one, or set distillation_token: false");
  }
  using Clock = std::chrono::steady_clock;
  Pending& p = pending_.emplace();
  p.out.begin = Clock::now();
  model_->train();

  // Mixed rows (mixup): each row's label target is its own label and its partner's, by shares.
  torch::Tensor labels = batch.labels;
  if (batch.label_mix.defined()) {
    const std::int64_t classes = model_->config().classes;
    const torch::Tensor own = batch.label_mix.to(torch::kFloat).unsqueeze(1);
    labels = torch::one_hot(batch.labels, classes).to(torch::kFloat) * own +
             torch::one_hot(batch.labels.index_select(0, batch.mix_partner), classes)
                     .to(torch::kFloat) *
                 (1 - own);
  }
  torch::Tensor logits;
  if (pipelined_) {
    RECORD_USER_SCOPE("student pipeline");
    optimizer().zero_grad();
    logits = pipelined_forward_backward(batch, labels, p);
    p.out.forward_end = p.out.backward_end = Clock::now();
  } else {
    {
      RECORD_USER_SCOPE("student forward");  // the parts' names in LibTorch's profiler
      ModelOutput forward;
      {
        Autocast autocast(options_.bf16);
        forward = model_->forward(batch.images);
      }
      logits = loss_of(forward, batch.teacher_logits, labels, batch.targets, p.loss);
      p.out.loss = p.loss.total.item<double>();
    }
    p.out.forward_end = Clock::now();
    {
      RECORD_USER_SCOPE("student backward");
      optimizer().zero_grad();
      // Backward even for a non-finite loss: with data parallelism every rank must take part
      // in the gradient all-reduce, and the non-finite gradients then tell every rank to skip.
      p.loss.total.backward();
    }
    p.out.backward_end = Clock::now();
  }
  // Counted now: the batch's pooled buffers may be reused once this call returns.
  p.out.correct =
      static_cast<std::uint64_t>(logits.argmax(1).eq(batch.labels).sum().item<std::int64_t>());
  p.out.batch_number = batch.number;
  p.end_position = batch.end_position;
  if (!batch.views.empty()) p.epoch = batch.views.back().epoch;
  p.out.seen = static_cast<std::uint64_t>(batch.size());
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
  loss = teacher_logits.defined()
             ? kd_loss(logits, teacher_logits, labels, options_.loss, regression, scaled,
                       distillation)
             : supervised_loss(logits, labels, options_.loss.regression_weight,
                               options_.loss.label_smoothing, regression, scaled);
  return logits;
}

torch::Tensor Trainer::pipelined_forward_backward(const data::Batch& batch,
                                                  const torch::Tensor& labels,
                                                  Pending& step) {
  Pipelined& p = *pipelined_;
  const int m = p.schedule.microbatches;
  const std::int64_t size = batch.size();
  if (size < m) {
    throw Error("batch " + std::to_string(batch.number) + " has " + std::to_string(size) +
                " samples, fewer than microbatches (" + std::to_string(m) + ")");
  }
  const auto split = [m](const torch::Tensor& t) {
    return t.defined() ? t.tensor_split(m)
                       : std::vector<torch::Tensor>(static_cast<std::size_t>(m));
  };
  p.images = split(batch.images);
  p.teacher_logits = split(batch.teacher_logits);
  p.labels = split(labels);
  p.targets = split(batch.targets);
  p.losses.assign(static_cast<std::size_t>(m), {});
  p.logits.assign(static_cast<std::size_t>(m), {});
  std::vector<double> weights;  // n_m / B: the loss is the batch's mean
  for (const torch::Tensor& images : p.images) {
    weights.push_back(static_cast<double>(images.size(0)) / static_cast<double>(size));
  }
  const PipelineBatchResult r = run_pipeline_batch(
      p.schedule, p.stages, [&p](int i) { return p.images[static_cast<std::size_t>(i)]; },
      options_.pipeline.threads, weights);
  step.out.loss = r.loss;
  step.out.bubble = r.bubble;
  step.out.peak_in_flight = *std::max_element(r.peak_in_flight.begin(), r.peak_in_flight.end());
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
  step.loss = {weighted(&KdLoss::total), weighted(&KdLoss::ce), weighted(&KdLoss::kd),
               weighted(&KdLoss::regression)};
  return torch::cat(p.logits);
}

std::size_t Trainer::buckets_per_step() const { return sync_ ? sync_->buckets().size() : 1; }

void Trainer::sync_bucket(std::size_t b) {
  if (sync_) sync_->complete(b);
}

StepOutcome Trainer::apply() {
  if (!pending_) throw Error("Trainer::apply without a step in flight (call forward_backward)");
  using Clock = std::chrono::steady_clock;
  Pending p = std::move(*pending_);
  pending_.reset();
  StepOutcome& out = p.out;
  if (sync_) sync_->end_step();
  out.sync_end = Clock::now();
  RECORD_USER_SCOPE("optimizer");
  const std::uint64_t step = state_.step + 1;
  const double clip = options_.clip_grad_norm;
  const double grad_norm =
      torch::nn::utils::clip_grad_norm_(model_->parameters(), clip > 0 ? clip : INFINITY);

  state_.data_position = p.end_position;
  if (p.epoch) state_.epoch = *p.epoch;
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
    optimizer().zero_grad();
    ++state_.skipped_steps;
    out.end = Clock::now();
    return out;
  }

  out.lr = scheduled_lr(options_.optimizer, state_.step, state_.total_steps);
  set_lr(optimizer(), out.lr);
  if (zero_) {
    zero_->step();
  } else {
    optimizer_->step();
  }
  out.end = Clock::now();
  state_.step = step;
  out.applied = true;
  return out;
}

std::string Trainer::checkpoint(bool with_optimizer) const {
  return checkpoint_bytes(model_, with_optimizer ? &optimizer() : nullptr, state_);
}

double Trainer::sync_comm_seconds() const { return sync_ ? sync_->comm_seconds() : 0; }

std::int64_t Trainer::optimizer_state_bytes() const {
  return dist::optimizer_state_bytes(optimizer());
}

}  // namespace flowtrain::train
