#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "graph/registry.hpp"
#include "stages/data/batch.hpp"
#include "stages/data/sources/class_medians.hpp"
#include "stages/train/inference/inference_model.hpp"
#include "stages/train/models/compute.hpp"

namespace flowtrain::dist {
class World;
}

namespace flowtrain::train {

/// The params of `evaluate`: the model's (InferenceOptions), where class medians come from and
/// where each image's prediction goes.
struct EvaluateOptions {
  InferenceOptions inference;
  std::string class_targets_from;
  std::string predictions;
  template <class Declare>
  void declare(Declare& d) {
    inference.declare(d);
    d(class_targets_from, "class_targets_from",
      "a CSV manifest with targets (the training split's): also report mae_by_class, the mean "
      "absolute error of answering each image's targets with the medians of its predicted "
      "class's rows there (empty: not)",
      {.type = ParamType::kPath});
    d(predictions, "predictions",
      "a CSV file to write each image's prediction to, by its index in the dataset: index, path, "
      "label, predicted (class), probability (of the predicted class), then target_K and "
      "output_K per regression value; to compare models photo by photo (empty: not written)",
      {.type = ParamType::kOutputPath});
  }
};

/// Measures a model on held-out batches: top-1 and top-5 accuracy, and the mean absolute error
/// of a regression head against the batch targets (`mae`); with `class_targets_from`, also that
/// of the predicted class's median targets (`mae_by_class`: what the class alone tells of the
/// targets, beside what the head tells). Serial and in order, so the sums (and the results) are
/// the same on every run. In a data-parallel job each rank evaluates its shard and the counts
/// are summed over the ranks at the end (and rank 0 writes every rank's predictions); its source
/// should then have `uneven: split`, since the default (pad) repeats images to even out the
/// ranks, which would count them twice.
class EvaluateStage final : public SerialSink<data::Batch> {
 public:
  using Options = EvaluateOptions;
  /// `context`: the run's services; its process group (dist::World) if the run is a rank of
  /// a job.
  explicit EvaluateStage(const Options& options, const BuildContext& context = {});
  ~EvaluateStage() override;
  static StageDoc describe();

  std::size_t threads_per_invocation() const override { return intraop_threads_; }
  bool intra_op_parallel() const override { return true; }
  std::vector<StageResult> results() const override;

  /// Top-1 accuracy so far (0 before any batch).
  double top1() const;
  double top5() const;

 protected:
  void consume(data::Batch&& batch, ItemContext& ctx) override;
  void finish() override;

 private:
  void keep_predictions(const data::Batch& batch, const ModelOutput& out,
                        const torch::Tensor& predicted);
  void write_predictions();

  std::unique_ptr<InferenceModel> model_;
  int intraop_threads_;
  dist::World* world_;  // the job's process group (nullptr: a single process)
  std::uint64_t seen_ = 0, top1_ = 0, top5_ = 0;
  std::uint64_t regression_values_ = 0;
  double abs_error_ = 0;
  std::optional<data::ClassTargetMedians> class_targets_;  // with class_targets_from
  std::uint64_t class_target_values_ = 0;
  double class_abs_error_ = 0;
  std::string predictions_path_, predictions_header_;
  std::vector<std::pair<std::uint64_t, std::string>> predictions_;  // source index, CSV row
};

}  // namespace flowtrain::train
