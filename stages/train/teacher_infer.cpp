#include "stages/train/teacher_infer.hpp"

#include <torch/torch.h>

#include <chrono>

#include "distributed/job.hpp"
#include "graph/error.hpp"
#include "stages/train/compute.hpp"
#include "stages/train/inference_model.hpp"
#include "stages/train/teacher_cache.hpp"

namespace flowtrain::train {

TeacherInferStage::TeacherInferStage(const Options& options)
    : model_(InferenceModel::load_required(options.inference.model,
                                           options.inference.precision())),
      model_path_(options.inference.model),
      precision_(options.inference.precision()),
      intraop_threads_(options.inference.intraop_threads) {
  const int k = options.ranks_per_shard;
  skip_ = k > 1 && shard_group(job_placement_from_env(), k).member != k - 1;
}

TeacherInferStage::~TeacherInferStage() = default;

StageDoc TeacherInferStage::describe() {
  return {
      "Runs a frozen teacher (a flowtrain checkpoint or a TorchScript module) on each batch "
      "and adds its logits (and regression outputs) to the batch, for the student's "
      "distillation loss.",
      option_specs<Options>(), "intraop_threads"};
}

ModelOutput TeacherInferStage::forward(const at::Tensor& images, double& seconds) {
  IntraOpThreads threads(intraop_threads_);
  const auto begin = std::chrono::steady_clock::now();
  ModelOutput out = model_->forward(images);
  const auto ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - begin)
          .count();
  forward_ns_ += static_cast<std::uint64_t>(ns);
  images_ += static_cast<std::uint64_t>(images.size(0));
  ++batches_;
  if (out.logits.dim() != 2 || out.logits.size(0) != images.size(0)) {
    throw Error("the teacher returned logits of shape " + c10::str(out.logits.sizes()) +
                " for a batch of " + std::to_string(images.size(0)) + "; expected [" +
                std::to_string(images.size(0)) + ", classes]");
  }
  seconds = static_cast<double>(ns) / 1e9;
  return out;
}

std::optional<data::Batch> TeacherInferStage::process(data::Batch&& batch, ItemContext&) {
  if (skip_) {
    if (batch.teacher_pending) {
      throw Error("ranks_per_shard does not combine with a teacher_cache yet: the cache would "
                  "wait for outputs this rank does not compute");
    }
    return std::move(batch);
  }
  if (std::shared_ptr<data::TeacherOutputsPending> pending = std::move(batch.teacher_pending)) {
    // A teacher_cache sent the batch: compute the rows it lacks, and let it fill the batch.
    const std::vector<std::int64_t>& rows = pending->rows();
    ModelOutput out;
    double seconds = 0;
    if (!rows.empty()) {
      const auto n = static_cast<std::int64_t>(rows.size());
      out = forward(
          n == batch.size()
              ? batch.images
              : batch.images.index_select(
                    0, torch::from_blob(const_cast<std::int64_t*>(rows.data()), {n}, torch::kLong)),
          seconds);
    }
    std::call_once(fingerprint_once_, [&] {
      fingerprint_ =
          teacher_fingerprint(model_path_, precision_ == InferenceModel::Precision::kBFloat16);
    });
    pending->complete(batch, out.logits, out.regression, seconds, fingerprint_);
    return std::move(batch);
  }
  double seconds = 0;
  ModelOutput out = forward(batch.images, seconds);
  batch.teacher_logits = std::move(out.logits);
  batch.teacher_regression = std::move(out.regression);
  return std::move(batch);
}

std::vector<StageResult> TeacherInferStage::results() const {
  const double images = static_cast<double>(images_.load());
  const double forward_s = static_cast<double>(forward_ns_.load()) / 1e9;
  std::vector<StageResult> out = {{"images", images}};
  if (batches_ == 0 || forward_s <= 0) return out;  // a teacher_cache had every view
  out.push_back({"forward_ms", forward_s * 1e3 / static_cast<double>(batches_.load())});
  if (const ModelConfig* config = model_->config()) {
    out.push_back(
        {"gflops", static_cast<double>(config->forward_flops()) * images / forward_s / 1e9});
  }
  return out;
}

FLOWTRAIN_REGISTER_STAGE("teacher_infer", TeacherInferStage);

}  // namespace flowtrain::train
