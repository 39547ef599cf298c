#include "stages/train/student_step.hpp"

#include <torch/torch.h>

#include <cmath>
#include <filesystem>

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
      int_param("image_size", 112, "input side in pixels (augment's size)", 1),
      int_param("classes", 0, "number of classes (required)", 0),
      int_param("regression_outputs", 0, "size of the regression head (0: none)", 0),
      int_param("patch_size", 0, "patch side (0: the preset's)", 0),
      int_param("dim", 0, "embedding width (0: the preset's)", 0),
      int_param("depth", 0, "number of blocks (0: the preset's)", 0),
      int_param("heads", 0, "attention heads (0: the preset's)", 0),
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
      keep_checkpoints_(static_cast<std::uint64_t>(params.get_int("keep_checkpoints"))) {
  optimizer_options_.lr = params.get_float("lr");
  optimizer_options_.min_lr = params.get_float("min_lr");
  optimizer_options_.warmup_steps = static_cast<std::uint64_t>(params.get_int("warmup_steps"));
  optimizer_options_.weight_decay = params.get_float("weight_decay");
  loss_options_.alpha = params.get_float("alpha");
  loss_options_.temperature = params.get_float("temperature");
  loss_options_.regression_weight = params.get_float("regression_weight");
  if (loss_options_.alpha > 1) throw Error("param 'alpha' must be in [0, 1]");
  if ((checkpoint_every_ > 0 || params.get_bool("resume")) && checkpoint_dir_.empty()) {
    throw Error("checkpoint_every and resume need a checkpoint_dir");
  }

  // The model's initial weights and every random draw of training follow from the seed.
  torch::manual_seed(static_cast<std::uint64_t>(params.get_int("seed")));
  model_ = ViT(vit_config_from(params));
  optimizer_ = make_adamw(model_, optimizer_options_);

  if (!checkpoint_dir_.empty()) {
    std::error_code ec;
    fs::create_directories(checkpoint_dir_, ec);
    if (ec) throw Error("cannot create checkpoint_dir " + checkpoint_dir_ + ": " + ec.message());
  }
  if (params.get_bool("resume")) {
    if (const std::optional<std::string> path = latest_checkpoint(checkpoint_dir_)) {
      const Checkpoint checkpoint = read_checkpoint(*path);
      restore_training(checkpoint, model_, *optimizer_);
      state_ = checkpoint.state;
      resumed_ = true;
    }
  }
}

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
      string_param("checkpoint_dir", "", "folder for checkpoints (empty: none written)"),
      int_param("checkpoint_every", 0, "write a checkpoint every N steps (0: only at the end)", 0),
      int_param("keep_checkpoints", 2, "step checkpoints kept (older ones are deleted)", 1),
      bool_param("resume", false,
                 "continue from the newest checkpoint in checkpoint_dir, if there is one"),
  };
  params.insert(params.end(), training.begin(), training.end());
  return {"Trains a ViT student, one serial step per batch in order: forward, loss "
          "(distillation from the batch's teacher outputs, else supervised), backward, gradient "
          "clipping, AdamW with warm-up + cosine; checkpoints and exact resume.",
          std::move(params)};
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

  ViTOutput out;
  {
    Autocast autocast(bf16_);
    out = model_->forward(batch.images);
  }
  const torch::Tensor logits = out.logits.to(torch::kFloat);
  const torch::Tensor regression =
      out.regression.defined() ? out.regression.to(torch::kFloat) : torch::Tensor();
  const torch::Tensor targets = regression.defined() ? batch.targets : torch::Tensor();
  const KdLoss loss =
      batch.teacher_logits.defined()
          ? kd_loss(logits, batch.teacher_logits, batch.labels, loss_options_, regression, targets)
          : supervised_loss(logits, batch.labels, loss_options_.regression_weight, regression,
                            targets);
  const double loss_value = loss.total.item<double>();
  const auto forward_end = Clock::now();

  optimizer_->zero_grad();
  double grad_norm = 0;
  if (std::isfinite(loss_value)) {
    loss.total.backward();
    grad_norm = torch::nn::utils::clip_grad_norm_(
        model_->parameters(), clip_grad_norm_ > 0 ? clip_grad_norm_ : INFINITY);
  }
  const auto backward_end = Clock::now();

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
    optimizer_->zero_grad();
    ++state_.skipped_steps;
    return;
  }

  const double lr = scheduled_lr(optimizer_options_, state_.step, state_.total_steps);
  set_lr(*optimizer_, lr);
  optimizer_->step();
  const auto end = Clock::now();
  state_.step = step;
  ++steps_this_run_;
  forward_s_ += seconds(begin, forward_end);
  backward_s_ += seconds(forward_end, backward_end);
  optimizer_s_ += seconds(backward_end, end);

  const std::int64_t correct =
      logits.argmax(1).eq(batch.labels).sum().item<std::int64_t>();
  history_.push_back({step, batch.number, loss_value, lr, static_cast<std::uint64_t>(correct),
                      static_cast<std::uint64_t>(batch.size()), begin, end});

  if (checkpoint_every_ > 0 && step % checkpoint_every_ == 0) save(step_checkpoint_name(step));
}

void StudentStepStage::finish() {
  if (checkpoint_dir_.empty() || steps_this_run_ == 0) return;
  // A run that reached the end of its data is final; one stopped early is a resumable step.
  save(state_.step >= state_.total_steps ? "final.pt" : step_checkpoint_name(state_.step));
}

void StudentStepStage::save(const std::string& name) {
  const auto begin = Clock::now();
  save_checkpoint((fs::path(checkpoint_dir_) / name).string(), model_, optimizer_.get(), state_);
  // Keep the newest keep_checkpoints step files; final.pt is never deleted.
  std::vector<std::string> steps;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(checkpoint_dir_, ec)) {
    const std::string file = entry.path().filename().string();
    if (file.rfind("step-", 0) == 0 && file.size() == step_checkpoint_name(0).size()) {
      steps.push_back(entry.path().string());
    }
  }
  std::sort(steps.begin(), steps.end());
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
  }
  if (state_.skipped_steps > 0) {
    out.push_back({"skipped_nonfinite", static_cast<double>(state_.skipped_steps)});
  }
  if (steps_this_run_ > 0) {
    const double per_step_ms = 1e3 / static_cast<double>(steps_this_run_);
    out.push_back({"forward_ms", forward_s_ * per_step_ms});
    out.push_back({"backward_ms", backward_s_ * per_step_ms});
    out.push_back({"optimizer_ms", optimizer_s_ * per_step_ms});
  }
  if (checkpoint_s_ > 0) out.push_back({"checkpoint_s", checkpoint_s_});
  return out;
}

FLOWTRAIN_REGISTER_STAGE("student_step", StudentStepStage);

}  // namespace flowtrain::train
