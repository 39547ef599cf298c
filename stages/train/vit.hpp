#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <string>

namespace flowtrain::train {

/// The shape of a Vision Transformer. Fill it with designated initializers or take a preset
/// from `vit_config`; `validate()` (also called by the model) throws flowtrain::Error naming the
/// first bad field.
///
///   ViTConfig config{.image_size = 32, .patch_size = 8, .dim = 64, .depth = 2, .heads = 4,
///                    .classes = 10, .regression_outputs = 1};
///   config.validate();
struct ViTConfig {
  int image_size = 0;
  int patch_size = 0;
  int channels = 3;
  int dim = 0;
  int depth = 0;
  int heads = 0;
  double mlp_ratio = 4.0;
  int classes = 0;
  int regression_outputs = 0;  // 0: no regression head
  double dropout = 0;          // after the position embedding, attention output and MLP layers
  /// The regression head's outputs are multiplied by this, so that it learns targets of order
  /// one while predicting in the targets' units (energy in kcal, say).
  double regression_scale = 1;

  /// Throws flowtrain::Error unless every size is > 0 (regression_outputs >= 0, regression_scale > 0), image_size is
  /// divisible by patch_size, dim by heads, and 0 <= dropout < 1.
  void validate() const;

  /// (image_size / patch_size)^2.
  std::int64_t patches() const;
  /// The MLP's hidden width, int(mlp_ratio * dim) as timm computes it.
  std::int64_t mlp_hidden() const;

  /// Floating-point operations of one image's forward pass in its matrix products (a multiply
  /// and an add are two): the patch embedding, each block's qkv, attention (q k^T and
  /// attention x v), output projection and MLP, and the heads. Elementwise work (LayerNorm,
  /// softmax, GELU, additions) is left out: it is a few percent, and not what the machine's
  /// GEMM ceiling measures. 1.11e9 for vit_cpu_teacher at 112 px with 10 classes.
  std::int64_t forward_flops() const;
  /// The same for a training step's forward and backward: backward computes each product's
  /// gradient with respect to both operands (twice the forward's FLOPs), except the images'.
  std::int64_t train_flops() const;
};

/// A named preset at the given input size and class count: "vit_ti" (dim 192, depth 12,
/// heads 3), "vit_s" (384, 12, 6), "vit_b" (768, 12, 12), and the CPU-sized
/// "vit_cpu_teacher" (384, 6, 6) and "vit_cpu_student" (192, 4, 3), all with 16 px patches and
/// mlp_ratio 4. An unknown name throws flowtrain::Error listing the known ones.
///
///   ViTConfig config = vit_config("vit_cpu_student", 224, 101);
///   config.regression_outputs = 1;
ViTConfig vit_config(const std::string& preset, int image_size, int classes);

/// What a ViT forward returns.
struct ViTOutput {
  torch::Tensor logits;      // [B, classes]
  torch::Tensor regression;  // [B, regression_outputs]; undefined without a regression head
};

/// Patch embedding: a Conv2d with kernel = stride = patch, flattened to tokens.
///
///   PatchEmbed embed(3, 384, 16);
///   torch::Tensor tokens = embed(images);  // [B, 3, 224, 224] -> [B, 196, 384]
class PatchEmbedImpl : public torch::nn::Module {
 public:
  PatchEmbedImpl(std::int64_t channels, std::int64_t dim, std::int64_t patch);
  torch::Tensor forward(const torch::Tensor& images);

 private:
  torch::nn::Conv2d proj_{nullptr};
};
TORCH_MODULE(PatchEmbed);

/// Multi-head self-attention with a fused qkv projection and an output projection.
///
///   Attention attention(384, 6, 0.0);
///   torch::Tensor y = attention(x);  // x, y: [B, N, 384]
class AttentionImpl : public torch::nn::Module {
 public:
  AttentionImpl(std::int64_t dim, std::int64_t heads, double dropout);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  std::int64_t heads_;
  double scale_;
  double dropout_;
  torch::nn::Linear qkv_{nullptr};
  torch::nn::Linear proj_{nullptr};
};
TORCH_MODULE(Attention);

/// The block MLP: Linear(dim, hidden) -> GELU -> Linear(hidden, dim), dropout after each.
///
///   Mlp mlp(384, 1536, 0.0);
///   torch::Tensor y = mlp(x);  // x, y: [B, N, 384]
class MlpImpl : public torch::nn::Module {
 public:
  MlpImpl(std::int64_t dim, std::int64_t hidden, double dropout);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  double dropout_;
  torch::nn::Linear fc1_{nullptr};
  torch::nn::Linear fc2_{nullptr};
};
TORCH_MODULE(Mlp);

/// One pre-norm transformer block: x + attn(norm1(x)), then x + mlp(norm2(x)).
///
///   TransformerBlock block(384, 6, 1536, 0.0);
///   torch::Tensor y = block(x);  // x, y: [B, N, 384]
class TransformerBlockImpl : public torch::nn::Module {
 public:
  TransformerBlockImpl(std::int64_t dim, std::int64_t heads, std::int64_t hidden, double dropout);
  torch::Tensor forward(torch::Tensor x);

 private:
  torch::nn::LayerNorm norm1_{nullptr};
  Attention attn_{nullptr};
  torch::nn::LayerNorm norm2_{nullptr};
  Mlp mlp_{nullptr};
};
TORCH_MODULE(TransformerBlock);

/// A Vision Transformer (Dosovitskiy et al., timm's VisionTransformer with a class token):
/// patch embedding, class token, learned position embedding, `depth` pre-norm blocks, final
/// LayerNorm, and a classification head (plus an optional regression head) on the class token.
/// Parameter names follow timm's ("blocks.0.attn.qkv.weight", "head.bias"; the extra head is
/// "regression_head"), so a timm state dict maps one to one.
/// Parameters are initialised like timm (truncated normal, std 0.02, for Linear weights, the
/// position embedding and the class token; zero biases), so a model built after
/// torch::manual_seed(s) is the same for the same s.
///
///   torch::manual_seed(0);
///   ViT model(vit_config("vit_cpu_student", 224, 101));
///   ViTOutput out = model(images);  // images: [B, 3, 224, 224] float32
///   torch::Tensor loss = torch::cross_entropy_loss(out.logits, labels);
class ViTImpl : public torch::nn::Module {
 public:
  explicit ViTImpl(const ViTConfig& config);
  ViTOutput forward(const torch::Tensor& images);

  const ViTConfig& config() const { return config_; }

 private:
  void init_parameters();

  ViTConfig config_;
  PatchEmbed patch_embed_{nullptr};
  torch::Tensor cls_token_;  // [1, 1, dim]
  torch::Tensor pos_embed_;  // [1, 1 + patches, dim]
  torch::nn::ModuleList blocks_{nullptr};
  torch::nn::LayerNorm norm_{nullptr};
  torch::nn::Linear head_{nullptr};
  torch::nn::Linear regression_head_{nullptr};  // null without a regression head
};
TORCH_MODULE(ViT);

/// The number of scalar parameters of a module and its submodules (trainable or not).
///
///   std::int64_t n = parameter_count(*model);  // 5'717'416 for vit_ti at 224 px, 1000 classes
std::int64_t parameter_count(const torch::nn::Module& module);

}  // namespace flowtrain::train
