#pragma once

#include <torch/types.h>

#include <memory>
#include <string>

#include "graph/options.hpp"
#include "stages/train/vit.hpp"

namespace flowtrain::train {

/// A frozen model for inference (a teacher, or a model under evaluation): a flowtrain
/// checkpoint (the built-in ViT) or any TorchScript module, which is how a PyTorch user brings
/// a pretrained teacher (`torch.jit.script(model).save("teacher.pt")`).
///
///   std::unique_ptr<InferenceModel> teacher = InferenceModel::load("runs/kd/teacher/final.pt");
///   ViTOutput out = teacher->forward(batch.images);
class InferenceModel {
 public:
  virtual ~InferenceModel() = default;

  /// Loads either kind, telling them apart by content; throws Error naming the path and the
  /// reason (missing, neither kind, unreadable).
  static std::unique_ptr<InferenceModel> load(const std::string& path);
  /// The file a stage's `model` option names (declare_model_file); throws Error if it is empty
  /// (not given), else as load(path).
  static std::unique_ptr<InferenceModel> load_required(const std::string& model);

  /// Runs the model without gradients; safe to call from several threads at once.
  virtual ViTOutput forward(const torch::Tensor& images) = 0;

  /// "ViT dim 384 depth 6 heads 6, 10.7M parameters (checkpoint)" or "TorchScript module".
  virtual std::string description() const = 0;
};

/// The `model` option of the stages that run one, a plain `std::string model;` field of their
/// options struct, declared by `declare_model_file(d, model);` and read by
/// InferenceModel::load_required(options.model).
template <class Declare>
void declare_model_file(Declare& d, std::string& model) {
  d(model, "model",
    "model file: a flowtrain checkpoint (final.pt of a training run) or a TorchScript module; "
    "may be written by an earlier phase",
    {.type = ParamType::kOutputPath});
}

}  // namespace flowtrain::train
