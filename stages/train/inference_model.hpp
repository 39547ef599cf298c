#pragma once

#include <torch/types.h>

#include <memory>
#include <string>

#include "graph/options.hpp"
#include "stages/train/compute.hpp"
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
  /// The file a stage's `model` option names (InferenceOptions); throws Error if it is empty
  /// (not given), else as load(path).
  static std::unique_ptr<InferenceModel> load_required(const std::string& model);

  /// Runs the model without gradients; safe to call from several threads at once.
  virtual ViTOutput forward(const torch::Tensor& images) = 0;

  /// "ViT dim 384 depth 6 heads 6, 10.7M parameters (checkpoint)" or "TorchScript module".
  virtual std::string description() const = 0;
};

/// The options of the stages that run a frozen model (teacher_infer, evaluate): the model file,
/// read by InferenceModel::load_required(options.model), and the compute options.
struct InferenceOptions {
  std::string model;
  int intraop_threads = 1;
  std::string autocast = "none";
  template <class Declare>
  void declare(Declare& d) {
    d(model, "model",
      "model file: a flowtrain checkpoint (final.pt of a training run) or a TorchScript module; "
      "may be written by an earlier phase",
      {.type = ParamType::kOutputPath});
    declare_intraop_threads(d, intraop_threads);
    declare_autocast(d, autocast);
  }
};

}  // namespace flowtrain::train
