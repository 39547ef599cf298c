#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <string>
#include <vector>

namespace flowtrain::train {

/// The shape of an image model: a Vision Transformer (`arch` "vit"), a ResNet ("resnet"), or a
/// TorchScript module made in PyTorch ("torchscript": `script` names its file, and only
/// image_size, channels, classes and the regression fields apply). Fill it with designated
/// initializers or take a preset from `model_config`; `validate()` (also called by the model)
/// throws flowtrain::Error naming the first bad field.
///
///   ModelConfig config{.image_size = 32, .patch_size = 8, .dim = 64, .depth = 2, .heads = 4,
///                      .classes = 10, .regression_outputs = 1};
///   config.validate();
struct ModelConfig {
  std::string arch = "vit";
  int image_size = 0;
  int patch_size = 0;  // ViT
  int channels = 3;
  int dim = 0;    // ViT: the embedding width; ResNet: the first stage's width (doubled per stage)
  int depth = 0;  // ViT: blocks (a ResNet has stage_blocks)
  int heads = 0;  // ViT
  double mlp_ratio = 4.0;  // ViT
  int classes = 0;
  int regression_outputs = 0;  // 0: no regression head
  double dropout = 0;  // ViT: after the position embedding, attention output and MLP layers
  /// The regression head's outputs are multiplied by this, so that it learns targets of order
  /// one while predicting in the targets' units (energy in kcal, say).
  double regression_scale = 1;
  /// ViT: DeiT's distillation token, with its own head (see ModelOutput::distillation).
  bool distillation_token = false;
  /// ViT: stochastic depth, the rate of dropping a block's residual branch in training, rising
  /// linearly from 0 at the first block to this at the last (DeiT, timm's drop_path_rate).
  double drop_path = 0;
  /// ResNet: basic blocks per stage; stage s has width dim * 2^s and halves the resolution
  /// (but the first).
  std::vector<int> stage_blocks;
  /// ResNet: the stem. "imagenet": conv 7x7 stride 2 + max pool 3x3 stride 2 (the image / 4);
  /// "compact": conv 3x3 stride 2, no pool (the image / 2), for small inputs.
  std::string stem = "imagenet";
  /// TorchScript: the file (`torch.jit.script(model).save(path)`); its parameters are trained.
  std::string script;
  /// TorchScript: the file's ScriptedModel::code_fingerprint, set as the model loads it. A model
  /// built from a checkpoint's config that has one refuses a file whose code differs.
  std::string script_code;

  /// Throws flowtrain::Error unless the fields fit `arch`: every size > 0
  /// (regression_outputs >= 0, regression_scale > 0), for a ViT image_size divisible by
  /// patch_size and dim by heads, 0 <= dropout, drop_path < 1.
  void validate() const;

  bool is_vit() const { return arch == "vit"; }
  bool is_script() const { return arch == "torchscript"; }
  /// ViT: (image_size / patch_size)^2.
  std::int64_t patches() const;
  /// ViT: the MLP's hidden width, int(mlp_ratio * dim) as timm computes it.
  std::int64_t mlp_hidden() const;

  /// Floating-point operations of one image's forward pass in its matrix products and
  /// convolutions (a multiply and an add are two). For a ViT: the patch embedding, each
  /// block's qkv, attention (q k^T and attention x v), output projection and MLP, and the
  /// heads; for a ResNet every convolution and the heads. Elementwise work (norms, softmax,
  /// activations, additions) is left out: it is a few percent, and not what the machine's
  /// GEMM ceiling measures. 1.11e9 for vit_cpu_teacher at 112 px with 10 classes; 0 for a
  /// TorchScript module (its shape is not known).
  std::int64_t forward_flops() const;
  /// The same for a training step's forward and backward: backward computes each product's
  /// gradient with respect to both operands (twice the forward's FLOPs), except the images'.
  std::int64_t train_flops() const;
  /// A lower bound of the model's parameter count from its shape alone, without building it:
  /// the weights of its matrix products and convolutions (ViT: patch embedding, each block's
  /// qkv, projection and MLP, the heads; ResNet: each block's second convolution and the
  /// heads). Saturates at INT64_MAX. A checkpoint's config is checked against its file's size
  /// with it, so a damaged one cannot build a model larger than the file could hold. 0 for a
  /// TorchScript module.
  std::int64_t min_parameters() const;
  /// "ViT dim 384 depth 6 heads 6 patch 16", "ResNet width 64 blocks 2-2-2-2 (imagenet stem)"
  /// or "TorchScript student.pt".
  std::string describe() const;
};

/// The presets `model_config` knows, by arch: "vit_ti" (dim 192, depth 12, heads 3), "vit_s"
/// (384, 12, 6), "vit_b" (768, 12, 12), the CPU-sized "vit_cpu_teacher" (384, 6, 6) and
/// "vit_cpu_student" (192, 4, 3), all with 16 px patches and mlp_ratio 4; "resnet18" (width 64,
/// blocks 2-2-2-2) and "resnet34" (64, 3-4-6-3), with the ImageNet stem.
const std::vector<std::string>& model_presets();

/// A named preset at the given input size and class count. An unknown name throws
/// flowtrain::Error listing the known ones.
///
///   ModelConfig config = model_config("vit_cpu_student", 224, 101);
///   config.regression_outputs = 1;
ModelConfig model_config(const std::string& preset, int image_size, int classes);

/// The shape a ResNet config gives: its stem and each basic block's widths and stride. One
/// source for the model, its FLOPs and its TorchScript export.
///
///   for (const auto& stage : resnet_layout(config).stages)
///     for (const ResNetLayout::Block& block : stage) ...  // "layer2.0": 32 -> 64, stride 2
struct ResNetLayout {
  struct Block {
    std::string name;  // "layer2.0", its parameters' prefix
    std::int64_t in = 0, out = 0, stride = 1;
    /// A 1x1 convolution and BatchNorm on the shortcut, as the shape changes.
    bool downsample() const { return stride != 1 || in != out; }
  };
  std::int64_t stem_kernel = 7, stem_padding = 3;  // the stem's convolution, stride 2
  bool stem_pool = true;                           // then a max pool 3x3 stride 2
  std::vector<std::vector<Block>> stages;          // "layer1", "layer2", ...
};
ResNetLayout resnet_layout(const ModelConfig& config);

/// What a model's forward returns.
struct ModelOutput {
  torch::Tensor logits;      // [B, classes]
  torch::Tensor regression;  // [B, regression_outputs]; undefined without a regression head
  /// [B, classes], the distillation token's head, in training mode only (a ViT with
  /// distillation_token); in eval mode `logits` is the mean of both heads, as in DeiT.
  torch::Tensor distillation;
};

/// The interface every trainable model has: a forward from float32 images [B, C, H, W] of the
/// config's size to ModelOutput, and its config. Hold one as ImageModel (a shared pointer);
/// `make_model` builds the one a config names.
///
/// Its forward is a chain of pieces, which pipeline partitions split between blocks:
/// forward(images) is head(run_blocks(embed(images), 0, blocks())), the same operations.
class ImageModelImpl : public torch::nn::Module {
 public:
  explicit ImageModelImpl(ModelConfig config);
  virtual ModelOutput forward(const torch::Tensor& images) = 0;
  const ModelConfig& config() const { return config_; }

  /// The blocks of the chain: a ViT's transformer blocks, a ResNet's residual blocks.
  virtual int blocks() const = 0;
  /// The images to the first block's input (a ViT's tokens, a ResNet's stem output).
  virtual torch::Tensor embed(const torch::Tensor& images) = 0;
  /// Blocks [begin, end) on the output of embed or of the block before `begin`.
  virtual torch::Tensor run_blocks(torch::Tensor x, int begin, int end) = 0;
  /// The last block's output to the outputs (a ViT's final norm and heads; a ResNet's pooling
  /// and heads).
  virtual ModelOutput head(const torch::Tensor& x) = 0;
  /// The piece a parameter or buffer belongs to, by its name (named_parameters,
  /// named_buffers): 0 the embedding, 1 + i block i, blocks() + 1 the head.
  virtual int piece_of(const std::string& name) const = 0;

 protected:
  /// Throws Error unless images is [B, channels, image_size, image_size].
  void check_images(const torch::Tensor& images) const;
  /// The regression head's output in the targets' units (times regression_scale).
  torch::Tensor scale_regression(torch::Tensor regression) const;

  ModelConfig config_;
};
TORCH_MODULE(ImageModel);

/// The holder of a concrete model (ViT, ResNet): a ModuleHolder<Impl> that converts to
/// ImageModel, so it is passed wherever one is taken.
template <class Impl>
class ConcreteModel : public torch::nn::ModuleHolder<Impl> {
 public:
  using torch::nn::ModuleHolder<Impl>::ModuleHolder;
  operator ImageModel() const {  // NOLINT(google-explicit-constructor): a ViT is an ImageModel
    return ImageModel(std::shared_ptr<ImageModelImpl>(this->ptr()));
  }
};

/// How the models of one architecture are made. The file that defines an architecture registers
/// its maker under the name ModelConfig::arch gives it ("vit", "resnet", "torchscript"), from a
/// static initialiser, so make_model knows none of them:
///
///   [[maybe_unused]] const bool kRegistered =
///       register_architecture("vit", [](const ModelConfig& c) -> std::shared_ptr<ImageModelImpl> {
///         return ViT(c).ptr();
///       });
using ArchitectureMaker = std::shared_ptr<ImageModelImpl> (*)(const ModelConfig& config);
/// Returns true (for the initialiser); a second maker for one name replaces the first.
bool register_architecture(const char* arch, ArchitectureMaker make);

/// The model `config.arch` names, its weights initialised from the global torch seed, so a
/// model built after torch::manual_seed(s) is the same for the same s.
///
///   torch::manual_seed(0);
///   ImageModel model = make_model(model_config("resnet18", 96, 20));
///   ModelOutput out = model->forward(images);
ImageModel make_model(const ModelConfig& config);

/// `layer(x)`, but under bf16 autocast with the bias in bf16 too. LibTorch 1.13's CPU autocast
/// casts the input and the weight of a linear to bf16 but leaves the bias float32, then adds it
/// to the bf16 product in a separate mixed-type pass (6% of the bench teacher's bf16 forward);
/// with a bf16 bias at::linear fuses it into one addmm. Outside autocast this is exactly
/// layer(x).
torch::Tensor apply_linear(torch::nn::Linear& layer, const torch::Tensor& x);

/// The number of scalar parameters of a module and its submodules (trainable or not).
///
///   std::int64_t n = parameter_count(*model);  // 5'717'416 for vit_ti at 224 px, 1000 classes
std::int64_t parameter_count(const torch::nn::Module& module);

}  // namespace flowtrain::train
