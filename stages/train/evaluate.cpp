#include "stages/train/evaluate.hpp"

#include <torch/torch.h>

#include "distributed/world.hpp"
#include "graph/error.hpp"
#include "stages/train/compute.hpp"
#include "stages/train/inference_model.hpp"

namespace flowtrain::train {

EvaluateStage::EvaluateStage(const Options& options, const BuildContext& context)
    : model_(InferenceModel::load_required(options.model, options.precision())),
      intraop_threads_(options.intraop_threads),
      world_(context.find<dist::World>()) {}

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
}

void EvaluateStage::finish() {
  // Data-parallel: each rank saw its shard of the split; report the whole split on every rank.
  if (!world_) return;
  std::vector<torch::Tensor> sums = {torch::tensor(
      {static_cast<double>(seen_), static_cast<double>(top1_), static_cast<double>(top5_),
       static_cast<double>(regression_values_), abs_error_},
      torch::kDouble)};
  world_->wait(*world_->group().allreduce(sums), "the validation all-reduce");
  const auto total = [&](int i) { return sums[0][i].item<double>(); };
  seen_ = static_cast<std::uint64_t>(total(0));
  top1_ = static_cast<std::uint64_t>(total(1));
  top5_ = static_cast<std::uint64_t>(total(2));
  regression_values_ = static_cast<std::uint64_t>(total(3));
  abs_error_ = total(4);
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
  return out;
}

FLOWTRAIN_REGISTER_STAGE("evaluate", EvaluateStage);

}  // namespace flowtrain::train
