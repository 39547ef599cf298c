#pragma once

#include <torch/types.h>

#include <memory>
#include <string>
#include <vector>

#include "graph/options.hpp"
#include "stages/train/models/compute.hpp"
#include "stages/train/models/model.hpp"

namespace flowtrain::train {

/// A frozen model for inference (a teacher, or a model under evaluation): a flowtrain
/// checkpoint (the built-in ViT) or any TorchScript module, which is how a PyTorch user brings
/// a pretrained teacher (`torch.jit.script(model).save("teacher.pt")`).
///
///   std::unique_ptr<InferenceModel> teacher = InferenceModel::load("runs/kd/teacher/final.pt");
///   ModelOutput out = teacher->forward(batch.images);
class InferenceModel {
 public:
  virtual ~InferenceModel() = default;

  /// What the model computes in.
  enum class Precision {
    kFloat32,
    /// bf16 autocast, with the parameters autocast runs in bf16 (Linear weights and biases,
    /// convolution weights) cast to bfloat16 once at load instead of on every call. For a
    /// checkpoint the outputs equal, bit for bit, the ViT's own under autocast, in less time;
    /// for a TorchScript module they stay within bf16 rounding (its linears would add a float32
    /// bias). LayerNorm, the position embedding and the class token stay float32, as autocast
    /// computes them: a model wholly in bf16 would be slower (LibTorch 1.13's bf16 LayerNorm is
    /// ~9x slower than its float32 one; see docs/benchmarks.md).
    kBFloat16,
    /// float16 autocast on a GPU, the parameters held as for kBFloat16.
    kFloat16,
  };

  /// Loads either kind, telling them apart by content, onto `device`; throws Error naming the
  /// path and the reason (missing, neither kind, unreadable; kFloat16 off a GPU).
  /// With `init` (a weights file, init_weights): a checkpoint's model gets that file's weights
  /// instead of its own; a TorchScript module refuses it (Error), as it carries its weights.
  static std::unique_ptr<InferenceModel> load(
      const std::string& path,
      Precision precision = Precision::kFloat32,
      const std::string& init = "",
      const c10::Device& device = c10::Device(c10::DeviceType::CPU));
  /// The file a stage's `model` option names (InferenceOptions); throws Error if it is empty
  /// (not given), else as load.
  static std::unique_ptr<InferenceModel> load_required(
      const std::string& model,
      Precision precision = Precision::kFloat32,
      const std::string& init = "",
      const c10::Device& device = c10::Device(c10::DeviceType::CPU));

  /// Runs the model without gradients (under autocast for kBFloat16 and kFloat16) on float32
  /// images [B, C, H, W], wherever they are (a batch not yet there is copied to the model's
  /// device); returns float32 outputs on that device. Safe to call from several threads at
  /// once.
  virtual ModelOutput forward(const torch::Tensor& images) = 0;

  /// "ViT dim 384 depth 6 heads 6 patch 16, 10.70M parameters[, bf16]" or "TorchScript
  /// module[, bf16]".
  virtual std::string description() const = 0;

  /// The model's shape, for a checkpoint of the built-in ViT; nullptr for a TorchScript module.
  virtual const ModelConfig* config() const { return nullptr; }

  /// The blocks between which pipeline partitions may split the model
  /// (ImageModelImpl::blocks); 0 for one that cannot be split (a TorchScript module).
  virtual int blocks() const { return 0; }

  /// What one pipeline partition of the model gives.
  struct PartitionOutput {
    torch::Tensor activation;  // for the next partition; undefined from the last
    ModelOutput outputs;       // the last partition's, as forward gives them
  };
  /// Runs blocks [begin, end) of the model as forward runs the whole (no gradients, the same
  /// precision): from the images, embedded first, when `begin` is 0, else from the activation
  /// of the partition before; then the heads when `end` is blocks(). The partitions chained
  /// give forward's outputs bit for bit. Throws Error for a model that cannot be split. Safe to
  /// call from several threads at once.
  virtual PartitionOutput forward_partition(const torch::Tensor& input, int begin, int end);
  /// Frees the weights that forward_partition(x, begin, end) does not use: the other blocks',
  /// the embedding's unless `begin` is 0, the heads' unless `end` is blocks(). A partition's
  /// node so holds its chunk only; the model then runs that range only.
  virtual void keep_only(int /*begin*/, int /*end*/) {}
  /// The forward seconds of each piece on `images`, as forward_partition runs them (no
  /// gradients, its precision), ordered as train::piece_seconds orders them: the embedding,
  /// each block, the head. Throws Error for a model that cannot be split.
  virtual std::vector<double> piece_seconds(const torch::Tensor& images);
  /// The bytes of parameters and buffers it holds (a checkpoint; 0 for a TorchScript module).
  virtual std::int64_t weight_bytes() const { return 0; }
};

/// The options of the stages that run a frozen model (teacher_infer, evaluate): the model file,
/// read by InferenceModel::load_required(options.model), and the compute options.
struct InferenceOptions {
  std::string model;
  int intraop_threads = 1;
  std::string autocast = "none";
  std::string device = "auto";
  template <class Declare>
  void declare(Declare& d) {
    d(model, "model",
      "model file: a flowtrain checkpoint (final.pt of a training run) or a TorchScript module; "
      "may be written by an earlier phase",
      {.type = ParamType::kOutputPath});
    declare_intraop_threads(d, intraop_threads);
    declare_autocast(d, autocast);
    declare_device(d, device);
  }
  InferenceModel::Precision precision() const {
    const std::string word = resolve_autocast(autocast);
    return word == "bf16"   ? InferenceModel::Precision::kBFloat16
           : word == "fp16" ? InferenceModel::Precision::kFloat16
                            : InferenceModel::Precision::kFloat32;
  }
  /// load_required of `model` with these options.
  std::unique_ptr<InferenceModel> load(const std::string& init = "") const {
    return InferenceModel::load_required(model, precision(), init,
                                         dist::resolve_device(device));
  }
};

}  // namespace flowtrain::train
