#include "stages/train/inference/evaluate.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>

#include "distributed/world.hpp"
#include "graph/atomic_file.hpp"
#include "graph/csv.hpp"
#include "graph/error.hpp"
#include "stages/train/inference/inference_model.hpp"
#include "stages/train/models/compute.hpp"

namespace flowtrain::train {

EvaluateStage::EvaluateStage(const Options& options, const BuildContext& context)
    : model_(options.inference.load()),
      intraop_threads_(options.inference.intraop_threads),
      world_(context.find<dist::World>()),
      predictions_path_(options.predictions) {
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
      "batches: top-1 and top-5 accuracy, and the mean absolute error of a regression head; "
      "optionally each image's prediction, to a CSV. As ranks of a job, give its source "
      "`uneven: split`, so that no image is counted twice.",
      option_specs<Options>(), "intraop_threads"};
}

void EvaluateStage::consume(data::Batch&& batch, ItemContext&) {
  IntraOpThreads threads(intraop_threads_);
  batch.wait_copied();
  ModelOutput out = model_->forward(batch.images);
  // Counted on the host, with the batch's labels and targets (a few values a row).
  for (torch::Tensor* t : {&out.logits, &out.regression, &batch.labels, &batch.targets}) {
    if (t->defined()) *t = t->cpu();
  }
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
  if (!predictions_path_.empty()) keep_predictions(batch, out, top.select(1, 0));
}

// One CSV row per image, kept with its source index (the file's order).
void EvaluateStage::keep_predictions(const data::Batch& batch, const ModelOutput& out,
                                     const torch::Tensor& predicted) {
  const torch::Tensor probability =
      std::get<0>(out.logits.to(torch::kFloat).softmax(1).max(1)).contiguous();
  const torch::Tensor classes = predicted.contiguous(), labels = batch.labels.contiguous();
  const auto values = [](const torch::Tensor& t) {
    return t.defined() && t.dim() == 2 ? t.to(torch::kFloat).contiguous() : torch::Tensor();
  };
  const std::pair<const char*, torch::Tensor> columns[] = {{"target_", values(batch.targets)},
                                                           {"output_", values(out.regression)}};
  if (predictions_header_.empty()) {
    std::vector<std::string> header = {"index", "path", "label", "predicted", "probability"};
    for (const auto& [name, t] : columns) {
      for (std::int64_t k = 0; t.defined() && k < t.size(1); ++k) {
        header.push_back(name + std::to_string(k));
      }
    }
    predictions_header_ = csv_line(header);
  }
  const std::size_t rows = static_cast<std::size_t>(batch.size());
  const std::uint64_t first = seen_ - rows;  // without views: the count so far
  for (std::size_t row = 0; row < rows; ++row) {
    const std::uint64_t index = row < batch.views.size() ? batch.views[row].index : first + row;
    std::vector<std::string> fields = {
        std::to_string(index), row < batch.paths.size() ? batch.paths[row] : "",
        std::to_string(labels.data_ptr<std::int64_t>()[row]),
        std::to_string(classes.data_ptr<std::int64_t>()[row]),
        csv_number(probability.data_ptr<float>()[row])};
    for (const auto& [name, t] : columns) {
      for (std::int64_t k = 0; t.defined() && k < t.size(1); ++k) {
        fields.push_back(csv_number(t.data_ptr<float>()[static_cast<std::int64_t>(row) * t.size(1) + k]));
      }
    }
    predictions_.emplace_back(index, csv_line(fields));
  }
}

// Rank 0 of a job gathers every rank's header and rows (each as "index length bytes", so a
// quoted field may hold anything); the file lists them by source index.
void EvaluateStage::write_predictions() {
  if (predictions_path_.empty()) return;
  if (world_) {
    const auto record = [](std::uint64_t index, const std::string& bytes) {
      return std::to_string(index) + " " + std::to_string(bytes.size()) + " " + bytes;
    };
    std::string mine = record(0, predictions_header_);
    for (const auto& [index, line] : predictions_) mine += record(index, line);
    const std::vector<std::string> all = world_->gather_text("the predictions", mine);
    if (world_->rank() != 0) return;
    predictions_.clear();
    for (const std::string& text : all) {
      std::istringstream in(text);
      std::uint64_t index = 0;
      std::size_t size = 0;
      for (bool header = true; in >> index >> size && in.get() == ' '; header = false) {
        std::string bytes(size, '\0');
        in.read(bytes.data(), static_cast<std::streamsize>(size));
        if (!header) {
          predictions_.emplace_back(index, std::move(bytes));
        } else if (predictions_header_.empty()) {
          predictions_header_ = std::move(bytes);  // rank 0 had no image
        }
      }
    }
  }
  std::stable_sort(predictions_.begin(), predictions_.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::string text = predictions_header_;
  for (const auto& [index, line] : predictions_) text += line;
  const std::filesystem::path parent = std::filesystem::path(predictions_path_).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  try {
    if (ec) throw Error("cannot create folder " + parent.string() + ": " + ec.message());
    write_file_atomically(predictions_path_, text);
  } catch (const Error& e) {
    throw Error("param 'predictions': " + std::string(e.what()));
  }
}

void EvaluateStage::finish() {
  write_predictions();
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
