#pragma once

#include <memory>

#include "stages/train/models/model.hpp"

namespace torch::jit {
struct Module;
}

namespace flowtrain::train {

/// A TorchScript model made in PyTorch, trained as flowtrain's own are
/// (`torch.jit.script(model).save("student.pt")`, then `model: student.pt` on train_step): the
/// module's parameters and buffers are this model's, under their PyTorch names
/// ("features.0.0.weight"), so AdamW, clipping, gradient sync, ZeRO, weight averaging,
/// checkpoints and exports see them as they see a ViT's. `train()`/`eval()` reach the module
/// (dropout, batch norm). The forward's outputs follow ScriptedModel's contract, checked on
/// every call against the config: logits [B, classes]; a regression output exactly when
/// regression_outputs > 0, [B, regression_outputs] (multiplied by regression_scale as a
/// built-in head's); a distillation head [B, classes] if the module returns one.
///
/// It has no blocks a pipeline can split: pipeline partitions refuse it.
///
///   ModelConfig config{.arch = "torchscript", .image_size = 64, .classes = 10,
///                      .script = "student.pt"};
///   ImageModel model = make_scripted_model(config);
class ScriptedStudentImpl : public ImageModelImpl {
 public:
  /// Loads config.script; throws Error naming the file if it is not a TorchScript module.
  explicit ScriptedStudentImpl(ModelConfig config);
  ~ScriptedStudentImpl() override;

  ModelOutput forward(const torch::Tensor& images) override;
  void train(bool on = true) override;

  int blocks() const override { return 0; }
  torch::Tensor embed(const torch::Tensor& images) override;
  torch::Tensor run_blocks(torch::Tensor x, int begin, int end) override;
  ModelOutput head(const torch::Tensor& x) override;
  int piece_of(const std::string& /*name*/) const override { return 0; }

  /// The TorchScript module, whose tensors are this model's parameters and buffers.
  torch::jit::Module& module();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// The model of a ModelConfig whose arch is "torchscript" (make_model calls it).
std::shared_ptr<ImageModelImpl> make_scripted_model(const ModelConfig& config);

/// The TorchScript module of a model that make_scripted_model built.
torch::jit::Module& scripted_module(const ImageModel& model);

}  // namespace flowtrain::train
