#include "stages/train/student_step.hpp"

#include <torch/torch.h>

#include <cmath>
#include <filesystem>

#include "distributed/grad_sync.hpp"
#include "distributed/world.hpp"
#include "distributed/zero.hpp"
#include "graph/error.hpp"
#include "stages/train/compute.hpp"

namespace flowtrain::train {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Steps averaged in the reported loss and training accuracy.
constexpr std::size_t kRecentSteps = 20;

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

}  // namespace

std::vector<ParamSpec> vit_param_specs() {
  return {
      string_param("model", "vit_cpu_student", "ViT preset",
                   {"vit_ti", "vit_s", "vit_b", "vit_cpu_teacher", "vit_cpu_student"}),
      int_param("image_size", 112, "input side in pixels (augment's size)", 1, 8192),
      int_param("classes", 0, "number of classes (required)", 0, 1 << 20),
      int_param("regression_outputs", 0, "size of the regression head (0: none)", 0),
      float_param("regression_scale", 1.0,
                  "the regression head predicts target / scale, multiplied back in its output "
                  "(so targets like 350 kcal train at order one; the loss is on that scale)",
                  1e-9),
      int_param("patch_size", 0, "patch side (0: the preset's)", 0, 1024),
      int_param("dim", 0, "embedding width (0: the preset's)", 0, 1 << 16),
      int_param("depth", 0, "number of blocks (0: the preset's)", 0, 1024),
      int_param("heads", 0, "attention heads (0: the preset's)", 0, 1024),
      float_param("dropout", 0.0, "dropout probability", 0),
  };
}

ViTConfig vit_config_from(const Params& params) {
  if (params.get_int("classes") < 1) throw Error("param 'classes' is required (>= 1)");
  ViTConfig config = vit_config(params.get_string("model"),
                                static_cast<int>(params.get_int("image_size")),
                                static_cast<int>(params.get_int("classes")));
  const auto override_with = [&](const char* name, int& field) {
    if (const std::int64_t v = params.get_int(name); v > 0) field = static_cast<int>(v);
  };
  override_with("patch_size", config.patch_size);
  override_with("dim", config.dim);
  override_with("depth", config.depth);
  override_with("heads", config.heads);
  config.regression_outputs = static_cast<int>(params.get_int("regression_outputs"));
  config.dropout = params.get_float("dropout");
  config.regression_scale = params.get_float("regression_scale");
  config.validate();
  return config;
}

StudentStepStage::StudentStepStage(const Params& params)
    : clip_grad_norm_(params.get_float("clip_grad_norm")),
      skip_nonfinite_(params.get_string("on_nonfinite") == "skip"),
      intraop_threads_(static_cast<int>(params.get_int("intraop_threads"))),
      bf16_(wants_bf16(params)),
      configured_total_steps_(static_cast<std::uint64_t>(params.get_int("total_steps"))),
      checkpoint_dir_(params.get_string("checkpoint_dir")),
      checkpoint_every_(static_cast<std::uint64_t>(params.get_int("checkpoint_every"))),
      keep_checkpoints_(static_cast<std::uint64_t>(params.get_int("keep_checkpoints"))),
      snapshot_every_(static_cast<std::uint64_t>(params.get_int("snapshot_every"))) {
  optimizer_options_.lr = params.get_float("lr");
  optimizer_options_.min_lr = params.get_float("min_lr");
  optimizer_options_.warmup_steps = static_cast<std::uint64_t>(params.get_int("warmup_steps"));
  optimizer_options_.weight_decay = params.get_float("weight_decay");
  loss_options_.alpha = params.get_float("alpha");
  loss_options_.temperature = params.get_float("temperature");
  loss_options_.regression_weight = params.get_float("regression_weight");
  if (loss_options_.alpha > 1) throw Error("param 'alpha' must be in [0, 1]");
  if ((checkpoint_every_ > 0 || snapshot_every_ > 0 || params.get_bool("resume")) &&
      checkpoint_dir_.empty()) {
    throw Error("checkpoint_every, snapshot_every and resume need a checkpoint_dir");
  }

  // The model's initial weights and every random draw of training follow from the seed.
  torch::manual_seed(static_cast<std::uint64_t>(params.get_int("seed")));
  model_ = ViT(vit_config_from(params));
  dist::World* world = dist::World::current();
  if (world) {
    rank_ = world->rank();
    world_size_ = world->size();
  }
  if (params.get_bool("zero") && world) {
    std::vector<std::pair<std::string, torch::Tensor>> named;
    for (const auto& item : model_->named_parameters()) named.emplace_back(item.key(), item.value());
    zero_ = std::make_unique<dist::ShardedOptimizer>(
        named, world->group(),
        [this](const auto& shard) { return make_adamw(shard, optimizer_options_); });
  } else {
    optimizer_ = make_adamw(model_, optimizer_options_);
  }

  if (!checkpoint_dir_.empty()) {
    std::error_code ec;
    fs::create_directories(checkpoint_dir_, ec);
    if (ec) throw Error("cannot create checkpoint_dir " + checkpoint_dir_ + ": " + ec.message());
    // Each rank claims its own lock: a second job into the folder fails at once, by name.
    try {
      lock_ = std::make_unique<FolderLock>(checkpoint_dir_, rank_file(".lock", rank_));
    } catch (const Error& e) {
      throw Error(std::string("checkpoint_dir ") + e.what());
    }
  }
  if (params.get_bool("resume")) {
    if (const std::optional<std::string> path = latest_checkpoint(checkpoint_dir_, world_size_)) {
      const Checkpoint checkpoint = read_checkpoint(rank_file(*path, rank_));
      if (checkpoint.state.world_size != static_cast<std::uint64_t>(world_size_) ||
          checkpoint.state.zero_shards != (zero_ ? checkpoint.state.world_size : 0)) {
        throw Error(checkpoint.path + " was written by " +
                    std::to_string(checkpoint.state.world_size) + " rank(s)" +
                    (checkpoint.state.zero_shards ? " with ZeRO" : "") + "; resume it with the "
                    "same number of ranks and the same zero setting");
      }
      restore_training(checkpoint, model_, optimizer());
      state_ = checkpoint.state;
      resumed_ = true;
    }
  }
  state_.world_size = static_cast<std::uint64_t>(world_size_);
  state_.zero_shards = zero_ ? static_cast<std::uint64_t>(world_size_) : 0;
  if (world) {
    // After any restore: every rank starts from rank 0's weights.
    sync_ = std::make_unique<dist::GradSync>(
        *model_, world->group(),
        dist::GradSync::Options{
            .first_bucket_bytes = static_cast<std::int64_t>(params.get_float("first_bucket_mb") * 1e6),
            .bucket_bytes = static_cast<std::int64_t>(params.get_float("bucket_mb") * 1e6)});
  }
}

StudentStepStage::~StudentStepStage() = default;

torch::optim::AdamW& StudentStepStage::optimizer() { return zero_ ? zero_->local() : *optimizer_; }

StageDoc StudentStepStage::describe() {
  std::vector<ParamSpec> params = vit_param_specs();
  const std::vector<ParamSpec> training = {
      int_param("seed", 0, "seed of the initial weights and of dropout", 0),
      float_param("alpha", 0.5,
                  "weight of the label cross-entropy; 1 - alpha goes to distillation "
                  "(1: supervised, no teacher needed)",
                  0),
      float_param("temperature", 2.0, "distillation temperature T", 0),
      float_param("regression_weight", 0.0, "weight of the regression (MSE) term", 0),
      float_param("lr", 1e-3, "peak learning rate (AdamW)", 0),
      float_param("min_lr", 1e-5, "learning rate at the end of the cosine", 0),
      int_param("warmup_steps", 0, "linear warm-up steps", 0),
      int_param("total_steps", 0, "schedule length in steps (0: the batches the data will give)",
                0),
      float_param("weight_decay", 0.05, "AdamW weight decay on weight matrices", 0),
      float_param("clip_grad_norm", 1.0, "clip the gradient's global norm to this (0: off)", 0),
      string_param("on_nonfinite", "fail",
                   "a NaN/infinite loss or gradient: stop the run, or skip the update and count it",
                   {"fail", "skip"}),
      intraop_threads_param(),
      autocast_param(),
      output_path_param("checkpoint_dir", "folder for checkpoints (empty: none written)"),
      int_param("checkpoint_every", 0, "write a checkpoint every N steps (0: only at the end)", 0),
      int_param("keep_checkpoints", 2, "step checkpoints kept (older ones are deleted)", 1),
      int_param("snapshot_every", 0,
                "also write the model alone (no optimizer state) every N steps to "
                "checkpoint_dir/snapshots/, to validate along the training (0: never)",
                0),
      bool_param("resume", false,
                 "continue from the newest checkpoint in checkpoint_dir, if there is one"),
      float_param("first_bucket_mb", 1.0,
                  "data-parallel: size of the first gradient bucket to all-reduce (MB)", 0),
      float_param("bucket_mb", 25.0, "data-parallel: size of the other gradient buckets (MB)", 0),
      bool_param("zero", false,
                 "data-parallel: shard the optimizer state across the ranks (ZeRO stage 1)"),
  };
  params.insert(params.end(), training.begin(), training.end());
  return {"Trains a ViT student, one serial step per batch in order: forward, loss "
          "(distillation from the batch's teacher outputs, else supervised), backward, gradient "
          "clipping, AdamW with warm-up + cosine; checkpoints and exact resume.",
          std::move(params), "intraop_threads"};
}

std::optional<std::uint64_t> StudentStepStage::plan(std::optional<std::uint64_t> batches) {
  // A resumed run keeps the schedule it started with.
  if (!resumed_) {
    state_.total_steps = configured_total_steps_ > 0 ? configured_total_steps_ : batches.value_or(0);
  }
  return std::nullopt;
}

std::optional<std::uint64_t> StudentStepStage::resume_position() const {
  if (!resumed_) return std::nullopt;
  return state_.data_position;
}

void StudentStepStage::consume(data::Batch&& batch, ItemContext&) {
  if (!batch.teacher_logits.defined() && loss_options_.alpha < 1) {
    throw Error("batch " + std::to_string(batch.number) +
                " has no teacher outputs: put a teacher_infer stage before this one, or set "
                "alpha: 1 for supervised training");
  }
  IntraOpThreads threads(intraop_threads_);
  model_->train();
  const std::uint64_t step = state_.step + 1;
  const auto begin = Clock::now();
  if (steps_this_run_ == 0) {
    run_begin_ = begin;
  } else {
    data_wait_s_ += seconds(last_step_end_, begin);
  }

  ViTOutput out;
  {
    Autocast autocast(bf16_);
    out = model_->forward(batch.images);
  }
  const torch::Tensor logits = out.logits.to(torch::kFloat);
  // The loss sees the regression at the head's own scale (order one), not the targets' units.
  const double scale = model_->config().regression_scale;
  const torch::Tensor regression =
      out.regression.defined() ? out.regression.to(torch::kFloat) / scale : torch::Tensor();
  const torch::Tensor targets = regression.defined() ? batch.targets / scale : torch::Tensor();
  const KdLoss loss =
      batch.teacher_logits.defined()
          ? kd_loss(logits, batch.teacher_logits, batch.labels, loss_options_, regression, targets)
          : supervised_loss(logits, batch.labels, loss_options_.regression_weight, regression,
                            targets);
  const double loss_value = loss.total.item<double>();
  const auto forward_end = Clock::now();

  optimizer().zero_grad();
  // Backward even for a non-finite loss: with data parallelism every rank must take part in
  // the gradient all-reduce, and the non-finite gradients then tell every rank to skip.
  loss.total.backward();
  const auto backward_end = Clock::now();
  if (sync_) sync_->finish();
  const auto sync_end = Clock::now();
  const double grad_norm = torch::nn::utils::clip_grad_norm_(
      model_->parameters(), clip_grad_norm_ > 0 ? clip_grad_norm_ : INFINITY);

  state_.data_position = batch.end_position;
  if (!batch.views.empty()) state_.epoch = batch.views.back().epoch;
  if (!std::isfinite(loss_value) || !std::isfinite(grad_norm)) {
    std::string what = "step " + std::to_string(step) + " (batch " +
                       std::to_string(batch.number) + "): " +
                       (std::isfinite(loss_value) ? "gradient norm is " + number(grad_norm)
                                                  : "loss is " + number(loss_value)) +
                       " (cross-entropy " + number(loss.ce.item<double>());
    if (loss.kd.defined()) what += ", distillation " + number(loss.kd.item<double>());
    what += ")";
    if (!skip_nonfinite_) {
      throw Error(what + "; lower lr, or set on_nonfinite: skip to skip such steps");
    }
    optimizer().zero_grad();
    ++state_.skipped_steps;
    last_step_end_ = Clock::now();
    return;
  }

  const double lr = scheduled_lr(optimizer_options_, state_.step, state_.total_steps);
  set_lr(optimizer(), lr);
  if (zero_) {
    zero_->step();
  } else {
    optimizer_->step();
  }
  const auto end = Clock::now();
  state_.step = step;
  ++steps_this_run_;
  forward_s_ += seconds(begin, forward_end);
  backward_s_ += seconds(forward_end, backward_end);
  sync_s_ += seconds(backward_end, sync_end);
  optimizer_s_ += seconds(sync_end, end);

  const std::int64_t correct =
      logits.argmax(1).eq(batch.labels).sum().item<std::int64_t>();
  history_.push_back({step, batch.number, loss_value, lr, static_cast<std::uint64_t>(correct),
                      static_cast<std::uint64_t>(batch.size()), begin, end});
  log_step(history_.back(), state_.epoch);
  const double smoothed = steps_this_run_ == 1 ? loss_value : 0.9 * live_loss_.load() + 0.1 * loss_value;
  live_loss_.store(smoothed, std::memory_order_relaxed);
  live_images_.fetch_add(static_cast<std::uint64_t>(batch.size()), std::memory_order_relaxed);
  live_epoch_.store(state_.epoch + 1, std::memory_order_relaxed);
  live_step_.store(step, std::memory_order_relaxed);

  if (checkpoint_every_ > 0 && step % checkpoint_every_ == 0) save(step_checkpoint_name(step));
  if (snapshot_every_ > 0 && step % snapshot_every_ == 0 && rank_ == 0) {
    const auto snapshot_begin = Clock::now();
    const fs::path dir = fs::path(checkpoint_dir_) / "snapshots";
    fs::create_directories(dir);
    save_checkpoint((dir / step_checkpoint_name(step)).string(), model_, nullptr, state_);
    checkpoint_s_ += seconds(snapshot_begin, Clock::now());
  }
  last_step_end_ = Clock::now();
}

void StudentStepStage::log_step(const StepRecord& record, std::uint32_t epoch) {
  if (checkpoint_dir_.empty() || rank_ != 0) return;
  if (!step_log_.is_open()) {
    // A resumed run continues the log (rows of steps redone after the checkpoint repeat: the
    // last row of a step counts); a new run starts it afresh.
    const std::string path = (fs::path(checkpoint_dir_) / "steps.csv").string();
    fs::create_directories(checkpoint_dir_);
    const bool fresh = !resumed_ || !fs::exists(path);
    step_log_.open(path, fresh ? std::ios::trunc : std::ios::app);
    if (!step_log_) throw Error("cannot write " + path);
    if (fresh) step_log_ << "step,epoch,loss,correct,seen,lr,time_s\n";
  }
  char line[160];
  std::snprintf(line, sizeof line, "%llu,%u,%.6g,%llu,%llu,%.6g,%.3f\n",
                static_cast<unsigned long long>(record.step), epoch + 1, record.loss,
                static_cast<unsigned long long>(record.correct),
                static_cast<unsigned long long>(record.seen), record.lr,
                seconds(run_begin_, record.end));
  step_log_ << line;
}

std::vector<StageResult> StudentStepStage::live_results() const {
  return {{"step", static_cast<double>(live_step_.load(std::memory_order_relaxed))},
          {"total_steps", static_cast<double>(state_.total_steps)},
          {"epoch", static_cast<double>(live_epoch_.load(std::memory_order_relaxed))},
          {"loss", live_loss_.load(std::memory_order_relaxed)},
          {"images", static_cast<double>(live_images_.load(std::memory_order_relaxed))}};
}

void StudentStepStage::finish() {
  if (checkpoint_dir_.empty() || steps_this_run_ == 0) return;
  step_log_.flush();
  // A run that reached the end of its data is final; one stopped early is a resumable step.
  save(state_.step >= state_.total_steps ? "final.pt" : step_checkpoint_name(state_.step));
}

void StudentStepStage::save(const std::string& name) {
  const auto begin = Clock::now();
  // Each rank writes its own file: its data position, and with ZeRO its optimizer shard.
  const std::string path = (fs::path(checkpoint_dir_) / name).string();
  step_log_.flush();
  save_checkpoint(rank_file(path, rank_), model_, &optimizer(), state_);
  // Keep this rank's newest keep_checkpoints step files (each rank prunes its own: listing rank
  // 0's would miss the files whose rank-0 twin another process already removed); final.pt is
  // never deleted.
  const std::vector<std::string> steps = step_checkpoints(checkpoint_dir_, rank_);
  std::error_code ec;
  for (std::size_t i = 0; i + keep_checkpoints_ < steps.size(); ++i) fs::remove(steps[i], ec);
  checkpoint_s_ += seconds(begin, Clock::now());
}

std::vector<StageResult> StudentStepStage::results() const {
  std::vector<StageResult> out = {{"steps", static_cast<double>(state_.step)}};
  if (resumed_) out.push_back({"resumed_at", static_cast<double>(state_.step - steps_this_run_)});
  const std::size_t n = std::min(history_.size(), kRecentSteps);
  if (n > 0) {
    double loss = 0;
    std::uint64_t correct = 0, seen = 0;
    for (std::size_t i = history_.size() - n; i < history_.size(); ++i) {
      loss += history_[i].loss;
      correct += history_[i].correct;
      seen += history_[i].seen;
    }
    out.push_back({"loss", loss / static_cast<double>(n)});
    out.push_back({"train_top1", seen ? static_cast<double>(correct) / seen : 0});
    out.push_back({"lr", history_.back().lr});
    out.push_back({"images", static_cast<double>(live_images_.load(std::memory_order_relaxed))});
  }
  if (state_.skipped_steps > 0) {
    out.push_back({"skipped_nonfinite", static_cast<double>(state_.skipped_steps)});
  }
  if (steps_this_run_ > 0) {
    const double per_step_ms = 1e3 / static_cast<double>(steps_this_run_);
    if (steps_this_run_ > 1) {
      out.push_back({"data_wait_ms", data_wait_s_ * 1e3 / static_cast<double>(steps_this_run_ - 1)});
    }
    out.push_back({"forward_ms", forward_s_ * per_step_ms});
    out.push_back({"backward_ms", backward_s_ * per_step_ms});
    out.push_back({"optimizer_ms", optimizer_s_ * per_step_ms});
    if (sync_) {
      // sync_comm: all-reduce time from the first bucket's start to the last one's end;
      // sync_wait: the part of it not hidden behind backward.
      out.push_back({"sync_comm_ms", sync_->comm_seconds() * per_step_ms});
      out.push_back({"sync_wait_ms", sync_s_ * per_step_ms});
    }
  }
  if (world_size_ > 1) {
    out.push_back({"rank", static_cast<double>(rank_)});
    out.push_back({"optimizer_state_mb",
                   static_cast<double>(dist::optimizer_state_bytes(
                       zero_ ? zero_->local() : *optimizer_)) / 1e6});
  }
  if (checkpoint_s_ > 0) out.push_back({"checkpoint_s", checkpoint_s_});
  return out;
}

FLOWTRAIN_REGISTER_STAGE("student_step", StudentStepStage);

}  // namespace flowtrain::train
