#include "stages/train/step/train_step.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <filesystem>

#include "distributed/job.hpp"
#include "distributed/world.hpp"
#include "graph/error.hpp"
#include "stages/train/models/compute.hpp"
#include "stages/train/partitioned/batch_runner.hpp"
#include "stages/train/partitioned/partition_node.hpp"
#include "stages/train/step/grad_sync_stage.hpp"
#include "stages/train/step/optimizer_step.hpp"
#include "stages/train/step/step_times.hpp"
#include "stages/train/step/step_writers.hpp"

namespace flowtrain::train {

namespace fs = std::filesystem;

namespace {

// Steps averaged in the reported loss and training accuracy.
constexpr std::size_t kRecentSteps = 20;

}  // namespace

ModelConfig ModelOptions::config() const {
  if (classes < 1) throw Error("param 'classes' is required (>= 1)");
  const std::vector<std::string>& presets = model_presets();
  const bool preset = std::find(presets.begin(), presets.end(), model) != presets.end();
  ModelConfig config = preset ? model_config(model, image_size, classes)
                              : ModelConfig{.arch = "torchscript",
                                            .image_size = image_size,
                                            .classes = classes,
                                            .script = model};
  const auto override_with = [](int option, int& field) {
    if (option > 0) field = option;
  };
  override_with(patch_size, config.patch_size);
  override_with(dim, config.dim);
  override_with(depth, config.depth);
  override_with(heads, config.heads);
  if (!stage_blocks.empty()) {
    config.stage_blocks.clear();
    for (double blocks : stage_blocks) {
      if (blocks != static_cast<int>(blocks) || blocks < 1 || blocks > 1024) {
        throw Error("param 'stage_blocks' must hold whole numbers in [1, 1024]");
      }
      config.stage_blocks.push_back(static_cast<int>(blocks));
    }
  }
  if (!stem.empty()) {
    if (!preset) throw Error("model '" + model + "': stem does not apply to a TorchScript model");
    config.stem = stem;
  }
  config.regression_outputs = regression_outputs;
  config.dropout = dropout;
  config.drop_path = drop_path;
  config.distillation_token = distillation_token;
  config.regression_scale = regression_scale;
  try {
    config.validate();
  } catch (const Error& e) {
    // "ModelConfig: heads does not apply to arch 'resnet'" -> the param and the preset.
    std::string what = e.what();
    if (what.rfind("ModelConfig: ", 0) == 0) what = what.substr(13);
    throw Error("model '" + model + "': " + what);
  }
  return config;
}

PartitionOptions PartitionStepOptions::config(int intraop_threads) const {
  PartitionOptions o;
  o.partitions = partitions;
  o.microbatches = microbatches;
  o.schedule = partition_schedule;
  o.chunks_per_partition = chunks_per_partition;
  if (chunks_per_partition > 1 && o.schedule != PartitionScheduleKind::kInterleaved) {
    throw Error("param 'chunks_per_partition' (" + std::to_string(chunks_per_partition) +
                ") needs partition_schedule: interleaved");
  }
  o.splits = split_points_param(partition_splits);
  o.measured_balance = partition_balance == PartitionBalance::kMeasured;
  if (o.measured_balance && !o.splits.empty()) {
    throw Error("params 'partition_splits' and 'partition_balance: measured' both say where to "
                "split: give one of them");
  }
  o.threads = intraop_threads;  // each partition's: a node's in one process, a rank's in a job
  return o;
}

void TrainStepStage::check(const Options& options) {
  autocast_dtype(options.autocast, dist::resolve_device(options.device));
  if (!options.init_skip.empty() && options.init.empty()) {
    throw Error("param 'init_skip' needs init (the file whose other tensors are loaded)");
  }
  if ((options.checkpoint_every > 0 || options.snapshot_every > 0 || options.resume) &&
      options.checkpoint_dir.empty()) {
    throw Error("checkpoint_every, snapshot_every and resume need a checkpoint_dir");
  }
  if (options.model.config().is_script() && options.partitioned.partitions > 1) {
    throw Error("param 'partitions': a TorchScript model (" + options.model.model +
                ") has no blocks to split between partitions; use partitions: 1");
  }
  options.partitioned.config(options.intraop_threads);
}

TrainStepStage::TrainStepStage(const Options& options, const BuildContext& context)
    : session_(std::make_shared<TrainingSession>()), configured_total_steps_(options.total_steps) {
  session_->intraop_threads = options.intraop_threads;
  const std::string& checkpoint_dir = options.checkpoint_dir;
  check(options);
  TrainerOptions trainer;
  trainer.model = options.model.config();
  trainer.seed = options.seed;
  trainer.init = {.path = options.init, .skip = skip_prefixes(options.init_skip)};
  trainer.optimizer = options.optimizer;
  trainer.loss = options.loss;
  trainer.clip_grad_norm = options.clip_grad_norm;
  trainer.ema_decay = options.ema_decay;
  trainer.skip_nonfinite = options.on_nonfinite == OnNonfinite::kSkip;
  trainer.device = dist::resolve_device(options.device);
  trainer.autocast = autocast_dtype(options.autocast, trainer.device);
  trainer.zero = static_cast<int>(options.zero);
  trainer.first_bucket_bytes = static_cast<std::int64_t>(options.first_bucket_mb * 1e6);
  trainer.bucket_bytes = static_cast<std::int64_t>(options.bucket_mb * 1e6);
  dist::World* world = context.find<dist::World>();
  const int rank = world ? world->rank() : 0;
  const int world_size = world ? world->size() : 1;
  trainer.partitioned = options.partitioned.config(options.intraop_threads);
  partition_nodes_ = options.partitioned.partition_nodes(static_cast<std::size_t>(world_size));
  microbatches_ = options.partitioned.microbatches;
  // A rehearsal (autotune timing a layout) writes nothing, so it takes no lock either.
  if (!checkpoint_dir.empty() && !context.rehearsal()) {
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
  // A group torchrun restarted (--max_restarts) continues the job it replaces.
  if (options.resume || job_placement(context).restart > 0) {
    checkpoint = latest_checkpoint(checkpoint_dir);  // rank 0's file
    // Each rank reads its own; one the job that wrote it did not have keeps rank 0's.
    if (checkpoint && rank > 0 && static_cast<std::uint64_t>(rank) < checkpoint->state.world_size) {
      checkpoint.emplace(read_checkpoint(rank_file(checkpoint->path, rank)));
    }
  }
  session_->trainer = std::make_unique<Trainer>(trainer, world,
                                                checkpoint ? &*checkpoint : nullptr);
  session_->resumed_at_the_end = checkpoint &&
                                 fs::path(checkpoint->path).filename().string().rfind("final.pt", 0) != 0 &&
                                 checkpoint->state.total_steps > 0 &&
                                 checkpoint->state.step >= checkpoint->state.total_steps;
}

TrainStepStage::~TrainStepStage() = default;

StageDoc TrainStepStage::describe() {
  return {
      "Trains a model (a ViT or ResNet student, or a teacher from labels), one serial step per "
      "batch in order: forward, loss (distillation from the batch's teacher outputs, else "
      "supervised), backward, gradient clipping, AdamW with warm-up + cosine; exact resume. "
      "Emits a record per step; an entry whose output no stage takes brings the nodes "
      "`<name>/step_log`, `<name>/checkpoint` (with a checkpoint_dir) and `<name>/snapshot` "
      "(with snapshot_every), which write steps.csv, checkpoints and snapshots off the "
      "step's critical path.",
      option_specs<Options>(), "intraop_threads", /*threads_change_results=*/true};
}

std::vector<ExpandedNode> TrainStepStage::expand(const Params& params, const RunOptions& run) {
  const Options options = options_from<Options>(params);
  const std::string& dir = options.checkpoint_dir;
  // The rest of the step, always: in one process the model's partitions after the first,
  // then grad_sync, optimizer_step after it, whose token the entry's next forward waits for.
  std::vector<ExpandedNode> nodes;
  const PartitionStepOptions& pipeline = options.partitioned;
  if (pipeline.partition_nodes(run.ranks)) {
    for (int p = 1; p < pipeline.partitions; ++p) {
      ExpandedNode node{"partition" + std::to_string(p), "train_partition",
                        to_params(TrainPartitionOptions{
                            .partition = p,
                            .partitions = pipeline.partitions,
                            .microbatches = pipeline.microbatches,
                            .intraop_threads = options.intraop_threads})};
      if (p > 1) node.inputs = {"partition" + std::to_string(p - 1)};
      node.always = true;
      node.runs_with_entry = true;
      nodes.push_back(std::move(node));
    }
  }
  ExpandedNode sync{"grad_sync", "grad_sync", to_params(GradSyncStage::Options{})};
  if (!nodes.empty()) sync.inputs = {nodes.back().node};
  sync.always = true;
  sync.concurrency = kUnlimited;
  ExpandedNode step{
      "optimizer_step", "optimizer_step",
      to_params(OptimizerStepStage::Options{.intraop_threads = options.intraop_threads,
                                            .checkpoint_every = options.checkpoint_every,
                                            .snapshot_every = options.snapshot_every,
                                            .final_checkpoint = !dir.empty()})};
  step.inputs = {"grad_sync"};
  step.always = true;
  step.sends_token_to_entry = true;

  // The writers, when no entry takes the step's records.
  nodes.push_back(std::move(sync));
  nodes.push_back(std::move(step));
  nodes.push_back({"step_log", "step_log", to_params(StepLogStage::Options{.dir = dir})});
  if (!dir.empty()) {
    nodes.push_back(
        {"checkpoint", "checkpoint",
         to_params(CheckpointStage::Options{.dir = dir, .keep = options.keep_checkpoints})});
  }
  if (options.snapshot_every > 0) {
    nodes.push_back({"snapshot", "snapshot", to_params(SnapshotStage::Options{.dir = dir})});
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

std::optional<ResumePosition> TrainStepStage::resume_position() const {
  const Trainer& trainer = *session_->trainer;
  if (!trainer.resumed()) return std::nullopt;
  return ResumePosition{.items = state().data_position,
                        .shared = state().shared_data_position,
                        .resized = trainer.resized()};
}

void TrainStepStage::process(data::Batch&& batch, Emitter<GradBucket>& out) {
  Trainer& trainer = *session_->trainer;
  if (trainer.stopping()) {  // the ranks stop after the step before: no forward, no collective
    out.emit(GradBucket{session_, 0, 0});
    return;
  }
  if (partition_nodes_) {
    // Partition 0 here, the others in the nodes after it, all at once; the last ends the step.
    trainer.begin_partitions(batch);
    out.emit(GradBucket{session_, 0, 1});
    trainer.partitioned()->run_partition(0);
    return;
  }
  IntraOpThreads threads(session_->intraop_threads);
  const std::size_t buckets = trainer.forward_backward(batch);
  for (std::size_t b = 0; b < buckets; ++b) out.emit(GradBucket{session_, b, buckets});
}

void TrainStepStage::finish(Emitter<GradBucket>& out) {
  if (session_->resumed_at_the_end && session_->steps_this_run == 0) {
    out.emit(GradBucket{session_, 0, 0});
  }
}

StageWait TrainStepStage::waiting() const {
  return partition_nodes_ ? partition_wait(*session_, 0, microbatches_) : StageWait{};
}

void TrainStepStage::cancel() {
  if (PartitionedModel* model = session_->trainer->partitioned()) {
    model->cancel("the run failed in another stage");
  }
}

std::vector<StageResult> TrainStepStage::live_results() const {
  const TrainingSession& s = *session_;
  return {{"step", static_cast<double>(s.live_step.load(std::memory_order_relaxed))},
          {"total_steps", static_cast<double>(state().total_steps)},
          {"epoch", static_cast<double>(s.live_epoch.load(std::memory_order_relaxed))},
          {"loss", s.live_loss.load(std::memory_order_relaxed)},
          {"images", static_cast<double>(s.live_images.load(std::memory_order_relaxed))}};
}

std::vector<TimelineSpan> TrainStepStage::timeline() const {
  return {session_->timeline.begin(), session_->timeline.end()};
}

std::vector<StageResult> TrainStepStage::results() const {
  const TrainingSession& s = *session_;
  std::vector<StageResult> out = {{step_result::kSteps, static_cast<double>(state().step)}};
  if (s.trainer->resumed()) {
    out.push_back({"resumed_at", static_cast<double>(state().step - s.steps_this_run)});
  }
  if (s.trainer->resized()) {
    out.push_back({"resumed_from_ranks", static_cast<double>(s.trainer->resumed_ranks())});
  }
  if (const std::optional<InitCounts>& init = s.trainer->init_counts()) {
    out.push_back({"init_loaded", static_cast<double>(init->loaded)});
    out.push_back({"init_skipped", static_cast<double>(init->skipped)});
  }
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
    out.push_back(
        {step_result::kImages, static_cast<double>(s.live_images.load(std::memory_order_relaxed))});
  }
  if (state().skipped_steps > 0) {
    out.push_back({"skipped_nonfinite", static_cast<double>(state().skipped_steps)});
  }
  if (s.steps_this_run > 0) {
    const double per_step_ms = 1e3 / static_cast<double>(s.steps_this_run);
    if (s.steps_this_run > 1) {
      out.push_back({step_result::kDataWait,
                     s.data_wait_s * 1e3 / static_cast<double>(s.steps_this_run - 1)});
    }
    out.push_back({step_result::kForward, s.forward_s * per_step_ms});
    out.push_back({step_result::kBackward, s.backward_s * per_step_ms});
    out.push_back({step_result::kOptimizer, s.optimizer_s * per_step_ms});
    if (s.forward_s + s.backward_s > 0 && !s.trainer->model()->config().is_script()) {
      // The matrix products' rate in forward and backward: how near the machine's ceiling.
      const double gflops = static_cast<double>(s.trainer->model()->config().train_flops()) *
                            static_cast<double>(s.live_images.load()) /
                            (s.forward_s + s.backward_s) / 1e9;
      out.push_back({step_result::kGflops, gflops});
      const TrainerOptions& trainer = s.trainer->options();
      if (trainer.device.is_cpu()) {
        out.push_back({"matrix_rate_gflops", matrix_rate_gflops(trainer.autocast, s.intraop_threads)});
      }
    }
    if (s.trainer->partitioned()) {
      // Where the model was split: chunk c begins at block pipeline_split_c.
      const std::vector<int>& splits = state().pipeline_splits;
      for (std::size_t c = 0; c < splits.size(); ++c) {
        out.push_back({"pipeline_split_" + std::to_string(c + 1), static_cast<double>(splits[c])});
      }
      out.push_back({"pipeline_bubble", s.bubble_sum / static_cast<double>(s.steps_this_run)});
      out.push_back({"peak_microbatches_kept", static_cast<double>(s.peak_in_flight)});
      out.push_back({"peak_partition_mb",
                     static_cast<double>(s.steps_this_run > 1 ? s.peak_bytes : s.first_peak_bytes) /
                         1e6});
    }
    if (s.trainer->world_size() > 1) {
      // sync_comm: all-reduce time from the first bucket's start to the last one's end;
      // sync_wait: from the end of backward until every bucket was averaged (the part of it
      // not hidden behind backward).
      out.push_back({"sync_comm_ms", s.trainer->sync_comm_seconds() * per_step_ms});
      out.push_back({step_result::kSyncWait, s.sync_s * per_step_ms});
    }
  }
  if (s.trainer->world_size() > 1) {
    out.push_back({"rank", static_cast<double>(s.trainer->rank())});
    out.push_back({"optimizer_state_mb",
                   static_cast<double>(s.trainer->optimizer_state_bytes()) / 1e6});
    out.push_back({"gradient_mb", static_cast<double>(s.trainer->gradient_bytes()) / 1e6});
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
