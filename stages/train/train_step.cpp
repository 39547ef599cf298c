#include "stages/train/train_step.hpp"

#include <torch/torch.h>

#include <filesystem>

#include "distributed/world.hpp"
#include "graph/error.hpp"
#include "stages/train/compute.hpp"
#include "stages/train/grad_sync_stage.hpp"
#include "stages/train/optimizer_step.hpp"
#include "stages/train/step_writers.hpp"

namespace flowtrain::train {

namespace fs = std::filesystem;

namespace {

// Steps averaged in the reported loss and training accuracy.
constexpr std::size_t kRecentSteps = 20;

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

TrainStepStage::TrainStepStage(const Params& params)
    : session_(std::make_shared<TrainingSession>()),
      configured_total_steps_(static_cast<std::uint64_t>(params.get_int("total_steps"))) {
  session_->intraop_threads = static_cast<int>(params.get_int("intraop_threads"));
  const std::string checkpoint_dir = params.get_string("checkpoint_dir");
  const bool resume = params.get_bool("resume");
  if ((params.get_int("checkpoint_every") > 0 || params.get_int("snapshot_every") > 0 || resume) &&
      checkpoint_dir.empty()) {
    throw Error("checkpoint_every, snapshot_every and resume need a checkpoint_dir");
  }
  TrainerOptions options;
  options.model = vit_config_from(params);
  options.seed = static_cast<std::uint64_t>(params.get_int("seed"));
  options.optimizer.lr = params.get_float("lr");
  options.optimizer.min_lr = params.get_float("min_lr");
  options.optimizer.warmup_steps = static_cast<std::uint64_t>(params.get_int("warmup_steps"));
  options.optimizer.weight_decay = params.get_float("weight_decay");
  options.loss.alpha = params.get_float("alpha");
  options.loss.temperature = params.get_float("temperature");
  options.loss.regression_weight = params.get_float("regression_weight");
  options.clip_grad_norm = params.get_float("clip_grad_norm");
  options.skip_nonfinite = params.get_string("on_nonfinite") == "skip";
  options.bf16 = wants_bf16(params);
  options.zero = params.get_bool("zero");
  options.first_bucket_bytes = static_cast<std::int64_t>(params.get_float("first_bucket_mb") * 1e6);
  options.bucket_bytes = static_cast<std::int64_t>(params.get_float("bucket_mb") * 1e6);

  dist::World* world = dist::World::current();
  const int rank = world ? world->rank() : 0;
  const int world_size = world ? world->size() : 1;
  if (!checkpoint_dir.empty()) {
    std::error_code ec;
    fs::create_directories(checkpoint_dir, ec);
    if (ec) throw Error("cannot create checkpoint_dir " + checkpoint_dir + ": " + ec.message());
    // Each rank claims its own lock: a second job into the folder fails at once, by name.
    try {
      lock_ = std::make_unique<FolderLock>(checkpoint_dir, rank_file(".lock", rank));
    } catch (const Error& e) {
      throw Error(std::string("checkpoint_dir ") + e.what());
    }
  }
  std::optional<Checkpoint> checkpoint;
  if (resume) {
    if (const std::optional<std::string> path = latest_checkpoint(checkpoint_dir, world_size)) {
      checkpoint.emplace(read_checkpoint(rank_file(*path, rank)));
    }
  }
  session_->trainer = std::make_unique<Trainer>(options, world ? &world->group() : nullptr,
                                                checkpoint ? &*checkpoint : nullptr);
}

TrainStepStage::~TrainStepStage() = default;

StageDoc TrainStepStage::describe() {
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
  return {"Trains a ViT (a student, or a teacher from labels), one serial step per batch in "
          "order: forward, loss (distillation from the batch's teacher outputs, else "
          "supervised), backward, gradient clipping, AdamW with warm-up + cosine; exact resume. "
          "Emits a record per step; an entry whose output no stage takes brings the nodes "
          "`<name>/step_log`, `<name>/checkpoint` (with a checkpoint_dir) and `<name>/snapshot` "
          "(with snapshot_every), which write steps.csv, checkpoints and snapshots off the "
          "step's critical path.",
          std::move(params), "intraop_threads"};
}

std::vector<ExpandedNode> TrainStepStage::expand(const Params& params) {
  const std::string dir = params.get_string("checkpoint_dir");
  // The rest of the step, always: grad_sync after the entry, optimizer_step after it, whose
  // token the entry's next forward waits for.
  ExpandedNode sync{"grad_sync", "grad_sync", Params::defaults(GradSyncStage::describe().params)};
  sync.always = true;
  sync.concurrency = kUnlimited;
  ExpandedNode step{"optimizer_step", "optimizer_step",
                    Params::defaults(OptimizerStepStage::describe().params)};
  step.inputs = {"grad_sync"};
  step.always = true;
  step.sends_token_to_entry = true;
  for (const char* name : {"intraop_threads", "checkpoint_every", "snapshot_every"}) {
    step.params.set(name, params.get_int(name));
  }
  step.params.set("final_checkpoint", !dir.empty());

  // The writers, when no entry takes the step's records.
  auto writer = [&dir](std::string name, const StageDoc& doc) {
    ExpandedNode out{name, std::move(name), Params::defaults(doc.params)};
    out.params.set("dir", dir);
    return out;
  };
  std::vector<ExpandedNode> nodes = {std::move(sync), std::move(step),
                                     writer("step_log", StepLogStage::describe())};
  if (!dir.empty()) {
    nodes.push_back(writer("checkpoint", CheckpointStage::describe()));
    nodes.back().params.set("keep", params.get_int("keep_checkpoints"));
  }
  if (params.get_int("snapshot_every") > 0) {
    nodes.push_back(writer("snapshot", SnapshotStage::describe()));
  }
  return nodes;
}

std::optional<std::uint64_t> TrainStepStage::plan(std::optional<std::uint64_t> batches) {
  Trainer& trainer = *session_->trainer;
  // A resumed run keeps the schedule it started with.
  if (!trainer.resumed()) {
    trainer.set_total_steps(configured_total_steps_ > 0 ? configured_total_steps_
                                                        : batches.value_or(0));
  }
  if (!batches) return std::nullopt;
  return *batches * trainer.buckets_per_step();
}

std::optional<std::uint64_t> TrainStepStage::resume_position() const {
  if (!session_->trainer->resumed()) return std::nullopt;
  return state().data_position;
}

void TrainStepStage::process(data::Batch&& batch, Emitter<GradBucket>& out) {
  IntraOpThreads threads(session_->intraop_threads);
  const std::size_t buckets = session_->trainer->forward_backward(batch);
  for (std::size_t b = 0; b < buckets; ++b) out.emit(GradBucket{session_, b, buckets});
}

std::vector<StageResult> TrainStepStage::live_results() const {
  const TrainingSession& s = *session_;
  return {{"step", static_cast<double>(s.live_step.load(std::memory_order_relaxed))},
          {"total_steps", static_cast<double>(state().total_steps)},
          {"epoch", static_cast<double>(s.live_epoch.load(std::memory_order_relaxed))},
          {"loss", s.live_loss.load(std::memory_order_relaxed)},
          {"images", static_cast<double>(s.live_images.load(std::memory_order_relaxed))}};
}

std::vector<StageResult> TrainStepStage::results() const {
  const TrainingSession& s = *session_;
  std::vector<StageResult> out = {{"steps", static_cast<double>(state().step)}};
  if (s.trainer->resumed()) out.push_back({"resumed_at", static_cast<double>(state().step - s.steps_this_run)});
  const std::size_t n = std::min(s.history.size(), kRecentSteps);
  if (n > 0) {
    double loss = 0;
    std::uint64_t correct = 0, seen = 0;
    for (std::size_t i = s.history.size() - n; i < s.history.size(); ++i) {
      loss += s.history[i].loss;
      correct += s.history[i].correct;
      seen += s.history[i].seen;
    }
    out.push_back({"loss", loss / static_cast<double>(n)});
    out.push_back({"train_top1", seen ? static_cast<double>(correct) / seen : 0});
    out.push_back({"lr", s.history.back().lr});
    out.push_back({"images", static_cast<double>(s.live_images.load(std::memory_order_relaxed))});
  }
  if (state().skipped_steps > 0) {
    out.push_back({"skipped_nonfinite", static_cast<double>(state().skipped_steps)});
  }
  if (s.steps_this_run > 0) {
    const double per_step_ms = 1e3 / static_cast<double>(s.steps_this_run);
    if (s.steps_this_run > 1) {
      out.push_back({"data_wait_ms", s.data_wait_s * 1e3 / static_cast<double>(s.steps_this_run - 1)});
    }
    out.push_back({"forward_ms", s.forward_s * per_step_ms});
    out.push_back({"backward_ms", s.backward_s * per_step_ms});
    out.push_back({"optimizer_ms", s.optimizer_s * per_step_ms});
    if (s.trainer->world_size() > 1) {
      // sync_comm: all-reduce time from the first bucket's start to the last one's end;
      // sync_wait: from the end of backward until every bucket was averaged (the part of it
      // not hidden behind backward).
      out.push_back({"sync_comm_ms", s.trainer->sync_comm_seconds() * per_step_ms});
      out.push_back({"sync_wait_ms", s.sync_s * per_step_ms});
    }
  }
  if (s.trainer->world_size() > 1) {
    out.push_back({"rank", static_cast<double>(s.trainer->rank())});
    out.push_back({"optimizer_state_mb",
                   static_cast<double>(s.trainer->optimizer_state_bytes()) / 1e6});
  }
  if (s.checkpoint_s > 0) out.push_back({"checkpoint_s", s.checkpoint_s});
  return out;
}

FLOWTRAIN_REGISTER_STAGE("train_step", TrainStepStage);
// The former name, still accepted: the same stage under a doc that points to the new one.
const bool kStudentStepRegistered = [] {
  StageInfo info = *Registry::global().find("train_step");
  info.type = "student_step";
  info.doc.summary = "The former name of `train_step`, still accepted (same params, same nodes).";
  Registry::global().add(std::move(info));
  return true;
}();

}  // namespace flowtrain::train
