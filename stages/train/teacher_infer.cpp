#include "stages/train/teacher_infer.hpp"

#include <torch/torch.h>

#include <chrono>

#include "graph/error.hpp"
#include "stages/train/compute.hpp"
#include "stages/train/inference_model.hpp"

namespace flowtrain::train {

TeacherInferStage::TeacherInferStage(const Options& options)
    : model_(InferenceModel::load_required(options.model, options.precision())),
      intraop_threads_(options.intraop_threads) {}

TeacherInferStage::~TeacherInferStage() = default;

StageDoc TeacherInferStage::describe() {
  return {
      "Runs a frozen teacher (a flowtrain checkpoint or a TorchScript module) on each batch "
      "and adds its logits (and regression outputs) to the batch, for the student's "
      "distillation loss.",
      option_specs<Options>(), "intraop_threads"};
}

std::optional<data::Batch> TeacherInferStage::process(data::Batch&& batch, ItemContext&) {
  IntraOpThreads threads(intraop_threads_);
  const auto begin = std::chrono::steady_clock::now();
  ViTOutput out = model_->forward(batch.images);
  forward_ns_ += static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - begin)
          .count());
  images_ += static_cast<std::uint64_t>(batch.size());
  ++batches_;
  if (out.logits.dim() != 2 || out.logits.size(0) != batch.size()) {
    throw Error("the teacher returned logits of shape " + c10::str(out.logits.sizes()) +
                " for a batch of " + std::to_string(batch.size()) + "; expected [" +
                std::to_string(batch.size()) + ", classes]");
  }
  batch.teacher_logits = std::move(out.logits);
  batch.teacher_regression = std::move(out.regression);
  return std::move(batch);
}

std::vector<StageResult> TeacherInferStage::results() const {
  const double images = static_cast<double>(images_.load());
  const double forward_s = static_cast<double>(forward_ns_.load()) / 1e9;
  if (batches_ == 0 || forward_s <= 0) return {};
  std::vector<StageResult> out = {
      {"images", images}, {"forward_ms", forward_s * 1e3 / static_cast<double>(batches_.load())}};
  if (const ViTConfig* config = model_->config()) {
    out.push_back(
        {"gflops", static_cast<double>(config->forward_flops()) * images / forward_s / 1e9});
  }
  return out;
}

FLOWTRAIN_REGISTER_STAGE("teacher_infer", TeacherInferStage);

}  // namespace flowtrain::train
