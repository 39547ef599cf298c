#pragma once

#include <torch/types.h>

#include <memory>
#include <string>

#include "graph/params.hpp"
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
  /// The `model` param of the stages that run one (declared by model_param()).
  static std::unique_ptr<InferenceModel> load(const Params& params);

  /// Runs the model without gradients; safe to call from several threads at once.
  virtual ViTOutput forward(const torch::Tensor& images) = 0;

  /// "ViT dim 384 depth 6 heads 6, 10.7M parameters (checkpoint)" or "TorchScript module".
  virtual std::string description() const = 0;
};

/// The `model` param: the file InferenceModel::load(params) reads.
ParamSpec model_param();

}  // namespace flowtrain::train
