#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "stages/train/models/model.hpp"

namespace torch::jit {
struct Module;
}

namespace flowtrain::train {

/// Writes `model` as a TorchScript file that plain PyTorch (`torch.jit.load`) or LibTorch
/// (`torch::jit::load`) runs with no flowtrain code:
///
///   forward(images: Tensor[B, C, H, W] float32) -> Tensor logits [B, classes]
///   forward(images) -> Tuple[Tensor, Tensor] (logits, regression)   with a regression head
///
/// The module keeps timm's structure and parameter names (patch_embed.proj, cls_token,
/// pos_embed, blocks.N.{norm1, attn.qkv, attn.proj, norm2, mlp.fc1, mlp.fc2}, norm, head,
/// regression_head), holds CPU copies of the weights, and computes the eval-mode forward (no
/// dropout) whatever mode `model` is in. It also carries int attributes `image_size`,
/// `channels`, `classes` and `regression_outputs`. The file is written to `path + ".tmp"`,
/// fsynced, then renamed over `path`, so a reader never sees half a file. Throws
/// flowtrain::Error naming the path and the reason (unwritable folder, full disk...).
///
/// A TorchScript model (ModelConfig::is_script) is written as itself, with its trained weights
/// and in eval mode: the module made in PyTorch, its forward and outputs unchanged.
///
///   ViT model(model_config("vit_cpu_student", 224, 101));
///   export_torchscript(model, "student.pt");
///   // Python: torch.jit.load("student.pt")(images)
void export_torchscript(const ImageModel& model, const std::string& path);

/// A TorchScript model loaded for inference, e.g. a teacher trained in PyTorch and saved with
/// `torch.jit.save(torch.jit.script(model), path)`, or a file from `export_torchscript`. Its
/// forward takes float32 images [B, C, H, W] and returns a Tensor of logits [B, classes], or a
/// tuple (or list) (logits, regression) with regression [B, outputs] (a [B] regression becomes
/// [B, 1]). The module is loaded onto `device` (CPU by default, whatever device it was saved
/// from), put in eval mode, and run without autograd.
///
/// Errors are flowtrain::Error, one line each: "<path>: no such file", "<path>: not a
/// TorchScript model (<reason>)", "<path>: the module has no forward method", and, from
/// `forward`, "<path>: forward returned <type>, expected ..." or "<path>: forward failed:
/// <reason>".
///
/// The outputs a forward may return (the output contract, docs/models.md):
///   Tensor logits [B, classes]
///   Tuple[Tensor, Tensor] (logits, regression [B, outputs] or [B])
///   Dict[str, Tensor] {"logits": ..., "regression": ..., "distillation": [B, classes]}
///     ("logits" required; "distillation", a DeiT distillation head, is used by training)
///
/// Thread safety: `forward` may be called from several threads at once. It relies on
/// TorchScript's documented support for concurrent inference on one module (the graph executor
/// locks its own plan cache; the module's state is only read) and mutates nothing itself.
///
///   ScriptedModel teacher("teacher.pt");
///   ModelOutput out = teacher.forward(batch.images);  // out.logits: [B, classes]
class ScriptedModel {
 public:
  explicit ScriptedModel(const std::string& path, torch::Device device = torch::kCPU);
  ~ScriptedModel();
  ScriptedModel(ScriptedModel&&) noexcept;
  ScriptedModel& operator=(ScriptedModel&&) noexcept;

  ModelOutput forward(const torch::Tensor& images) const;
  /// forward with autograd on (for training the module: ScriptedStudent).
  ModelOutput forward_with_grad(const torch::Tensor& images) const;
  /// The loaded module: its parameters are the model's.
  torch::jit::Module& module();
  /// Casts to `dtype` each parameter that `select(class name of its module, parameter name)`
  /// accepts, e.g. ("__torch__.torch.nn.modules.linear.Linear", "weight").
  void cast_parameters(const std::function<bool(const std::string&, const std::string&)>& select,
                       torch::ScalarType dtype);
  ModelOutput operator()(const torch::Tensor& images) const { return forward(images); }

  const std::string& path() const;
  /// What the module's code is, not its weights: a hash of the file's code/*.py entries (their
  /// names and CRC-32s), 16 hex digits. The same for the same scripted class wherever its file
  /// lies; a checkpoint keeps it to know its model by.
  const std::string& code_fingerprint() const;
  /// The module's int attribute `image_size` (files from `export_torchscript` have one), if any.
  std::optional<int> image_size() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace flowtrain::train
