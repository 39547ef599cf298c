#include "stages/train/evaluate.hpp"

#include <torch/torch.h>

#include <cmath>

#include "distributed/world.hpp"
#include "graph/error.hpp"
#include "stages/train/compute.hpp"
#include "stages/train/inference_model.hpp"

namespace flowtrain::train {

EvaluateStage::EvaluateStage(const Options& options, const BuildContext& context)
    : model_(InferenceModel::load_required(options.inference.model,
                                           options.inference.precision())),
      intraop_threads_(options.inference.intraop_threads),
      world_(context.find<dist::World>()) {
  if (const std::string& path = options.class_targets_from; !path.empty()) {
    const std::string param = "param 'class_targets_from': ";
    data::CsvManifest manifest;
    try {
      manifest = data::read_csv_manifest(path);
    } catch (const Error& e) {
      throw Error(param + e.what());  // it names the file (and line)
    }
    try {
      class_targets_ = data::class_target_medians(manifest);
    } catch (const Error& e) {
      throw Error(param + path + ": " + e.what());
    }
  }
}

EvaluateStage::~EvaluateStage() = default;

StageDoc EvaluateStage::describe() {
  return {
      "Evaluates a model (a flowtrain checkpoint or a TorchScript module) on held-out "
      "batches: top-1 and top-5 accuracy, and the mean absolute error of a regression head.",
      option_specs<Options>(), "intraop_threads"};
}

void EvaluateStage::consume(data::Batch&& batch, ItemContext&) {
  IntraOpThreads threads(intraop_threads_);
  const ModelOutput out = model_->forward(batch.images);
  const torch::Tensor& logits = out.logits;
  if (logits.dim() != 2 || logits.size(0) != batch.size()) {
    throw Error("the model returned logits of shape " + c10::str(logits.sizes()) +
                " for a batch of " + std::to_string(batch.size()));
  }
  const std::int64_t k = std::min<std::int64_t>(5, logits.size(1));
  const torch::Tensor top = std::get<1>(logits.topk(k, 1));
  const torch::Tensor hits = top.eq(batch.labels.unsqueeze(1));
  top1_ += static_cast<std::uint64_t>(hits.select(1, 0).sum().item<std::int64_t>());
  top5_ += static_cast<std::uint64_t>(hits.any(1).sum().item<std::int64_t>());
  seen_ += static_cast<std::uint64_t>(batch.size());
  if (out.regression.defined() && batch.targets.defined() &&
      batch.targets.sizes() == out.regression.sizes()) {
    abs_error_ += (out.regression.to(torch::kDouble) - batch.targets.to(torch::kDouble))
                      .abs()
                      .sum()
                      .item<double>();
    regression_values_ += static_cast<std::uint64_t>(out.regression.numel());
  }
  if (class_targets_ && batch.targets.defined() &&
      batch.targets.size(1) == static_cast<std::int64_t>(class_targets_->overall.size())) {
    const torch::Tensor predicted = top.select(1, 0).contiguous();
    const torch::Tensor targets = batch.targets.to(torch::kFloat).contiguous();
    const auto* classes = predicted.data_ptr<std::int64_t>();
    const auto* values = targets.data_ptr<float>();
    const std::int64_t width = targets.size(1);
    for (std::int64_t row = 0; row < targets.size(0); ++row) {
      const std::vector<float>& answer = class_targets_->of(classes[row]);
      for (std::int64_t t = 0; t < width; ++t) {
        class_abs_error_ += std::abs(static_cast<double>(answer[static_cast<std::size_t>(t)]) -
                                     values[row * width + t]);
      }
    }
    class_target_values_ += static_cast<std::uint64_t>(targets.numel());
  }
}

void EvaluateStage::finish() {
  // Data-parallel: each rank saw its shard of the split; report the whole split on every rank.
  if (!world_) return;
  std::vector<torch::Tensor> sums = {torch::tensor(
      {static_cast<double>(seen_), static_cast<double>(top1_), static_cast<double>(top5_),
       static_cast<double>(regression_values_), abs_error_,
       static_cast<double>(class_target_values_), class_abs_error_},
      torch::kDouble)};
  world_->wait(*world_->group().allreduce(sums), "the validation all-reduce");
  const auto total = [&](int i) { return sums[0][i].item<double>(); };
  seen_ = static_cast<std::uint64_t>(total(0));
  top1_ = static_cast<std::uint64_t>(total(1));
  top5_ = static_cast<std::uint64_t>(total(2));
  regression_values_ = static_cast<std::uint64_t>(total(3));
  abs_error_ = total(4);
  class_target_values_ = static_cast<std::uint64_t>(total(5));
  class_abs_error_ = total(6);
}

double EvaluateStage::top1() const {
  return seen_ ? static_cast<double>(top1_) / static_cast<double>(seen_) : 0;
}

double EvaluateStage::top5() const {
  return seen_ ? static_cast<double>(top5_) / static_cast<double>(seen_) : 0;
}

std::vector<StageResult> EvaluateStage::results() const {
  std::vector<StageResult> out = {{"images", static_cast<double>(seen_)},
                                  {"top1", top1()},
                                  {"top5", top5()}};
  if (regression_values_ > 0) {
    out.push_back({"mae", abs_error_ / static_cast<double>(regression_values_)});
  }
  if (class_target_values_ > 0) {
    out.push_back({"mae_by_class", class_abs_error_ / static_cast<double>(class_target_values_)});
  }
  return out;
}

FLOWTRAIN_REGISTER_STAGE("evaluate", EvaluateStage);

}  // namespace flowtrain::train
