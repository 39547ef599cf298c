#include "stages/train/inference/teacher_infer.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "distributed/job.hpp"
#include "graph/error.hpp"
#include "stages/train/inference/inference_model.hpp"
#include "stages/train/inference/teacher_cache.hpp"
#include "stages/train/models/compute.hpp"
#include "stages/train/partitioned/batch_runner.hpp"

namespace flowtrain::train {

namespace {
// Where `partition_balance: measured` splits the teacher of `options` (`model`, loaded whole):
// each piece's forward timed on a probe batch, then the splits whose costliest chunk costs
// least. Once per process and teacher file: every partition node of a teacher is built on its
// own, and all must split alike.
std::vector<int> measured_teacher_splits(const TeacherInferOptions& options,
                                         InferenceModel& model) {
  const std::string& path = options.inference.model;
  std::error_code ec;
  const auto written = std::filesystem::last_write_time(path, ec).time_since_epoch().count();
  const auto key = std::make_tuple(path, written, options.inference.precision(),
                                   options.inference.intraop_threads, options.partitions);
  static std::mutex mutex;
  static std::map<decltype(key), std::vector<int>> measured;
  std::lock_guard lock(mutex);
  auto [it, added] = measured.try_emplace(key);
  if (!added) return it->second;
  try {
    const ModelConfig& config = *model.config();
    // A generator of its own: the run's random draws stay those of a run without measuring.
    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(0);
    const torch::Tensor probe = torch::randn(
        {16, config.channels, config.image_size, config.image_size}, generator, torch::kFloat);
    IntraOpThreads threads(options.inference.intraop_threads);
    it->second = measured_splits(model.piece_seconds(probe), options.partitions);
  } catch (...) {
    measured.erase(it);
    throw;
  }
  return it->second;
}

// The blocks partition `partition` of the teacher `model` runs: all of them without partitions.
std::pair<int, int> chunk_of(const TeacherInferOptions& options,
                             int partition,
                             InferenceModel& model) {
  const int partitions = options.partitions;
  if (partition >= partitions) {
    throw Error("param 'partition' (" + std::to_string(partition) + ") must be below partitions (" +
                std::to_string(partitions) + ")");
  }
  if (partitions == 1) {
    if (!options.partition_splits.empty()) {
      throw Error("param 'partition_splits' needs partitions > 1");
    }
    return {0, model.blocks()};
  }
  if (model.blocks() == 0) {
    throw Error("param 'partitions' (" + std::to_string(partitions) +
                "): " + options.inference.model + " is a " + model.description() +
                ", which cannot be split (a flowtrain checkpoint can)");
  }
  std::vector<int> splits = split_points_param(options.partition_splits);
  const bool measured = options.partition_balance == PartitionBalance::kMeasured;
  if (measured && !splits.empty()) {
    throw Error(
        "params 'partition_splits' and 'partition_balance: measured' both say where to "
        "split: give one of them");
  }
  if (splits.empty()) {
    splits = measured ? measured_teacher_splits(options, model)
                      : balanced_splits(model.blocks(), partitions);
  }
  if (static_cast<int>(splits.size()) + 1 != partitions) {
    throw Error("param 'partition_splits' gives " + std::to_string(splits.size() + 1) +
                " chunks for " + std::to_string(partitions) + " partitions");
  }
  const std::vector<int> bounds = chunk_bounds(model.blocks(), splits);
  const auto p = static_cast<std::size_t>(partition);
  return {bounds[p], bounds[p + 1]};
}
}  // namespace

TeacherInferStage::TeacherInferStage(const Options& options,
                                     const BuildContext& context,
                                     int partition)
    : model_(options.inference.load(options.init)),
      model_path_(options.inference.model),
      init_(options.init),
      autocast_(resolve_autocast(options.inference.autocast)),
      on_cpu_(!dist::resolve_device(options.inference.device).is_cuda()),
      intraop_threads_(options.inference.intraop_threads),
      partitions_(options.partitions) {
  const int k = options.ranks_per_shard;
  skip_ = k > 1 && shard_group(job_placement(context), k).member != k - 1;
  if (options.partitions > 1 && dist::resolve_device(options.inference.device).is_cuda()) {
    throw Error("param 'device': a teacher in partitions runs on the CPU only; use device: cpu, "
                "or partitions: 1 on a GPU");
  }
  std::tie(begin_, end_) = chunk_of(options, partition, *model_);
  if (partitions_ > 1) model_->keep_only(begin_, end_);
}

TeacherInferStage::~TeacherInferStage() = default;

StageDoc TeacherInferStage::describe() {
  return {
      "Runs a frozen teacher (a flowtrain checkpoint or a TorchScript module) on each batch "
      "and adds its logits (and regression outputs) to the batch, for the student's "
      "distillation loss. With partitions, a forward-only pipeline of graph nodes: the entry "
      "runs the first chunk of the blocks and brings `<name>/partition1` ... for the others.",
      option_specs<Options>(), "intraop_threads", /*threads_change_results=*/true};
}

std::vector<ExpandedNode> TeacherInferStage::expand(const Params& params, const RunOptions&) {
  const Options options = options_from<Options>(params);
  std::vector<ExpandedNode> nodes;
  for (int p = 1; p < options.partitions; ++p) {
    ExpandedNode node{"partition" + std::to_string(p), "teacher_partition",
                      to_params(TeacherPartitionOptions{options, p})};
    if (p > 1) node.inputs = {"partition" + std::to_string(p - 1)};
    // One activation waiting while the node runs another keeps it busy; more would only hold
    // memory (and batch buffers) while the chunk before runs ahead.
    node.queue_capacity = 2;
    node.always = true;
    nodes.push_back(std::move(node));
  }
  return nodes;
}

ModelOutput TeacherInferStage::forward(const at::Tensor& input,
                                       double& seconds,
                                       at::Tensor& activation) {
  IntraOpThreads threads(intraop_threads_);
  const auto begin = std::chrono::steady_clock::now();
  ModelOutput out;
  if (partitions_ == 1) {
    out = model_->forward(input);
  } else {
    InferenceModel::PartitionOutput part = model_->forward_partition(input, begin_, end_);
    out = std::move(part.outputs);
    activation = std::move(part.activation);
  }
  const auto ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - begin)
          .count();
  forward_ns_ += static_cast<std::uint64_t>(ns);
  images_ += static_cast<std::uint64_t>(input.size(0));
  ++batches_;
  seconds = static_cast<double>(ns) / 1e9;
  if (!last()) {
    activation_bytes_ += static_cast<std::uint64_t>(activation.nbytes());
    return out;
  }
  if (out.logits.dim() != 2 || out.logits.size(0) != input.size(0)) {
    throw Error("the teacher returned logits of shape " + c10::str(out.logits.sizes()) +
                " for a batch of " + std::to_string(input.size(0)) + "; expected [" +
                std::to_string(input.size(0)) + ", classes]");
  }
  return out;
}

std::optional<data::Batch> TeacherInferStage::process(data::Batch&& batch, ItemContext&) {
  if (skip_) {
    if (batch.teacher_pending) {
      throw Error(
          "ranks_per_shard does not combine with a teacher_cache yet: the cache would "
          "wait for outputs this rank does not compute");
    }
    return std::move(batch);
  }
  batch.wait_copied();
  // The first partition runs on the images, the others on the activation handed on.
  at::Tensor input = begin_ == 0 ? batch.images : std::move(batch.teacher_activation);
  double seconds = 0;
  if (const std::shared_ptr<data::TeacherOutputsPending>& pending = batch.teacher_pending) {
    // A teacher_cache sent the batch: compute the rows it lacks, and let the last partition
    // fill the batch. A first partition selects them; the activation has only those rows.
    const std::vector<std::int64_t>& rows = pending->rows();
    const auto n = static_cast<std::int64_t>(rows.size());
    ModelOutput out;
    if (n > 0) {
      if (begin_ == 0 && n < batch.size()) {
        input = input.index_select(
            0, torch::from_blob(const_cast<std::int64_t*>(rows.data()), {n}, torch::kLong));
      }
      out = forward(input, seconds, batch.teacher_activation);
    }
    if (!last()) return std::move(batch);
    std::shared_ptr<data::TeacherOutputsPending> done = std::move(batch.teacher_pending);
    // The cache stores on the host what the teacher computed on its device.
    const auto host = [](const at::Tensor& t) { return t.defined() ? t.cpu() : t; };
    done->complete(batch, host(out.logits), host(out.regression), seconds, fingerprint());
    return std::move(batch);
  }
  ModelOutput out = forward(input, seconds, batch.teacher_activation);
  if (last()) {
    batch.teacher_logits = std::move(out.logits);
    batch.teacher_regression = std::move(out.regression);
  }
  return std::move(batch);
}

std::uint64_t TeacherInferStage::fingerprint() const {
  std::call_once(fingerprint_once_, [&] {
    fingerprint_ = teacher_fingerprint(model_path_, autocast_);
  });
  return fingerprint_;
}

std::string TeacherInferStage::input_problem(const Stage& input) const {
  const auto* cache = dynamic_cast<const TeacherCacheStage*>(&input);
  if (cache == nullptr) return {};
  if (!init_.empty()) {
    // The cache keys its entries by the model file's content, which init's weights replace.
    return "runs the teacher " + model_path_ + " with init " + init_ +
           ", but a teacher_cache keys its entries by the model file alone: export the "
           "initialised teacher (flowtrain export " + model_path_ + " --init " + init_ +
           " --out TEACHER.pt) and give both that file";
  }
  if (cache->teacher() == fingerprint()) return {};
  const auto named = [](const std::string& model, const std::string& autocast) {
    return model + (autocast == "none" ? "" : " (autocast " + autocast + ")");
  };
  return "runs the teacher " + named(model_path_, autocast_) +
         ", but the teacher_cache it takes batches from keys its entries by " +
         named(cache->options().model, resolve_autocast(cache->options().autocast)) +
         ": give both the same model and autocast";
}

std::vector<StageResult> TeacherInferStage::results() const {
  const double images = static_cast<double>(images_.load());
  const double forward_s = static_cast<double>(forward_ns_.load()) / 1e9;
  std::vector<StageResult> out = {{"images", images}};
  if (batches_ == 0 || forward_s <= 0) return out;  // a teacher_cache had every view
  out.push_back({"forward_ms", forward_s * 1e3 / static_cast<double>(batches_.load())});
  if (partitions_ > 1) {
    out.push_back({"first_block", static_cast<double>(begin_)});
    out.push_back({"blocks", static_cast<double>(end_ - begin_)});
    out.push_back({"weights_mb", static_cast<double>(model_->weight_bytes()) / 1e6});
    if (!last()) {
      out.push_back({"activation_mb", static_cast<double>(activation_bytes_.load()) / 1e6 /
                                          static_cast<double>(batches_.load())});
    }
  } else if (const ModelConfig* config = model_->config(); config && !config->is_script()) {
    out.push_back(
        {"gflops", static_cast<double>(config->forward_flops()) * images / forward_s / 1e9});
    if (on_cpu_) {
      out.push_back({"matrix_rate_gflops",
                     matrix_rate_gflops(autocast_dtype(autocast_, c10::kCPU), intraop_threads_)});
    }
  }
  return out;
}

StageDoc TeacherPartitionStage::describe() {
  return {
      "A chunk of a teacher split into pipeline partitions after the first, brought by a "
      "teacher_infer entry with partitions as `<name>/partition<N>`: runs its blocks on the "
      "activation the chunk before handed on in the batch, and the last adds the outputs.",
      option_specs<Options>(), "intraop_threads", /*threads_change_results=*/true};
}

FLOWTRAIN_REGISTER_STAGE("teacher_infer", TeacherInferStage);
FLOWTRAIN_REGISTER_STAGE("teacher_partition", TeacherPartitionStage);

}  // namespace flowtrain::train
