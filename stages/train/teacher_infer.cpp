#include "stages/train/teacher_infer.hpp"

#include <torch/torch.h>

#include "graph/error.hpp"
#include "stages/train/compute.hpp"
#include "stages/train/inference_model.hpp"

namespace flowtrain::train {

TeacherInferStage::TeacherInferStage(const Options& options)
    : intraop_threads_(options.intraop_threads), bf16_(wants_bf16(options.autocast)) {
  model_ = InferenceModel::load_required(options.model);
}

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
  ViTOutput out;
  {
    Autocast autocast(bf16_);
    out = model_->forward(batch.images);
  }
  if (out.logits.dim() != 2 || out.logits.size(0) != batch.size()) {
    throw Error("the teacher returned logits of shape " + c10::str(out.logits.sizes()) +
                " for a batch of " + std::to_string(batch.size()) + "; expected [" +
                std::to_string(batch.size()) + ", classes]");
  }
  batch.teacher_logits = out.logits.to(torch::kFloat);
  if (out.regression.defined()) batch.teacher_regression = out.regression.to(torch::kFloat);
  return std::move(batch);
}

FLOWTRAIN_REGISTER_STAGE("teacher_infer", TeacherInferStage);

}  // namespace flowtrain::train
