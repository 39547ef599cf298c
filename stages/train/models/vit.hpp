#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <cstdint>

#include "stages/train/models/model.hpp"

namespace flowtrain::train {

/// Patch embedding: a Conv2d with kernel = stride = patch, flattened to tokens. Under autocast
/// it runs as the one matrix product it is (the patches as rows, times the kernel as a
/// [dim, channels * patch * patch] matrix), the same parameters: a strided convolution's
/// backward costs several times its product in bf16. Float32 keeps the convolution and its sums.
///
///   PatchEmbed embed(3, 384, 16);
///   torch::Tensor tokens = embed(images);  // [B, 3, 224, 224] -> [B, 196, 384]
class PatchEmbedImpl : public torch::nn::Module {
 public:
  PatchEmbedImpl(std::int64_t channels, std::int64_t dim, std::int64_t patch);
  torch::Tensor forward(const torch::Tensor& images);

 private:
  std::int64_t patch_;
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

/// One pre-norm transformer block: x + attn(norm1(x)), then x + mlp(norm2(x)); in training,
/// each residual branch is dropped for a sample with probability drop_path (and the kept ones
/// scaled by 1 / (1 - drop_path)), as timm's DropPath.
///
///   TransformerBlock block(384, 6, 1536, 0.0, 0.1);
///   torch::Tensor y = block(x);  // x, y: [B, N, 384]
class TransformerBlockImpl : public torch::nn::Module {
 public:
  TransformerBlockImpl(std::int64_t dim,
                       std::int64_t heads,
                       std::int64_t hidden,
                       double dropout,
                       double drop_path = 0);
  torch::Tensor forward(torch::Tensor x);

 private:
  torch::Tensor drop_path(const torch::Tensor& branch) const;

  double drop_path_;
  torch::nn::LayerNorm norm1_{nullptr};
  Attention attn_{nullptr};
  torch::nn::LayerNorm norm2_{nullptr};
  Mlp mlp_{nullptr};
};
TORCH_MODULE(TransformerBlock);

/// A Vision Transformer (Dosovitskiy et al., timm's VisionTransformer with a class token):
/// patch embedding, class token, learned position embedding, `depth` pre-norm blocks, final
/// LayerNorm, and a classification head (plus an optional regression head) on the class token.
/// With `distillation_token` it is DeiT's: a second token after the class token, with its own
/// head ("head_dist"), trained against the teacher (ModelOutput::distillation); in eval mode the
/// logits are the mean of both heads. Parameter names follow timm's ("blocks.0.attn.qkv.weight",
/// "head.bias", "dist_token"; the extra head is "regression_head"), so a timm state dict maps one
/// to one. Parameters are initialised like timm (truncated normal, std 0.02, for Linear weights,
/// the position embedding and the tokens; zero biases).
///
///   torch::manual_seed(0);
///   ViT model(model_config("vit_cpu_student", 224, 101));
///   ModelOutput out = model(images);  // images: [B, 3, 224, 224] float32
///   torch::Tensor loss = torch::cross_entropy_loss(out.logits, labels);
class ViTImpl : public ImageModelImpl {
 public:
  explicit ViTImpl(const ModelConfig& config);
  ModelOutput forward(const torch::Tensor& images) override;

  /// The pieces of forward (ImageModelImpl), for pipeline stages
  /// (stages/train/partitioned/batch_runner.hpp). The transformer blocks: config().depth.
  int blocks() const override { return static_cast<int>(config_.depth); }
  /// Patch embedding, tokens, position embedding -> [B, tokens, dim].
  torch::Tensor embed(const torch::Tensor& images) override;
  /// Blocks [begin, end) on the tokens.
  torch::Tensor run_blocks(torch::Tensor x, int begin, int end) override;
  /// Final norm and heads on the tokens.
  ModelOutput head(const torch::Tensor& x) override;
  /// "blocks.<i>." block i; "norm.", "head*", "regression_head." the head; the rest the
  /// embedding (patch_embed, cls_token, dist_token, pos_embed).
  int piece_of(const std::string& name) const override;

 private:
  void init_parameters();

  PatchEmbed patch_embed_{nullptr};
  torch::Tensor cls_token_;   // [1, 1, dim]
  torch::Tensor dist_token_;  // [1, 1, dim], with distillation_token
  torch::Tensor pos_embed_;   // [1, tokens, dim]
  torch::nn::ModuleList blocks_{nullptr};
  torch::nn::LayerNorm norm_{nullptr};
  torch::nn::Linear head_{nullptr};
  torch::nn::Linear head_dist_{nullptr};        // with distillation_token
  torch::nn::Linear regression_head_{nullptr};  // null without a regression head
};
class ViT : public ConcreteModel<ViTImpl> {
 public:
  using ConcreteModel<ViTImpl>::ConcreteModel;
};

}  // namespace flowtrain::train
