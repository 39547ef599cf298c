#pragma once

#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>
#include <string>
#include <vector>

#include "stages/train/models/model.hpp"

namespace flowtrain::train {

/// ResNet's basic block (He et al. 2016): conv 3x3 (stride) -> BatchNorm -> ReLU -> conv 3x3 ->
/// BatchNorm, plus the input (through a 1x1 convolution and BatchNorm when the stride or the
/// width changes), then ReLU. The second BatchNorm starts at zero scale, so each block starts
/// as the identity (Goyal et al. 2017; torchvision's zero_init_residual).
///
///   BasicBlock block(64, 128, 2);
///   torch::Tensor y = block(x);  // x: [B, 64, H, W] -> y: [B, 128, H / 2, W / 2]
class BasicBlockImpl : public torch::nn::Module {
 public:
  BasicBlockImpl(std::int64_t in, std::int64_t out, std::int64_t stride);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  torch::nn::Conv2d conv1_{nullptr};
  torch::nn::BatchNorm2d bn1_{nullptr};
  torch::nn::Conv2d conv2_{nullptr};
  torch::nn::BatchNorm2d bn2_{nullptr};
  torch::nn::Sequential downsample_{nullptr};  // null when the shape is kept
};
TORCH_MODULE(BasicBlock);

/// A ResNet of basic blocks (torchvision's resnet18/34 shape): a stem (ModelConfig::stem), one
/// stage per entry of stage_blocks, each twice as wide as the one before and (but the first)
/// at half the resolution, global average pooling, optional dropout, and a classification head
/// (plus an optional regression head). Parameter and buffer names follow torchvision's
/// ("conv1.weight", "layer1.0.bn2.running_mean", "fc.bias"; the extra head is
/// "regression_head"), so a torchvision state dict of the same shape maps one to one.
/// Convolutions are initialised as torchvision's (Kaiming normal, fan out), BatchNorm to 1 and 0
/// (but each block's last, see BasicBlock), the heads as torch.nn.Linear.
///
///   torch::manual_seed(0);
///   ResNet model(model_config("resnet18", 96, 20));
///   ModelOutput out = model(images);  // images: [B, 3, 96, 96] float32
class ResNetImpl : public ImageModelImpl {
 public:
  explicit ResNetImpl(const ModelConfig& config);
  ModelOutput forward(const torch::Tensor& images) override;

  /// The pieces of forward (ImageModelImpl): the residual blocks of every stage, in order.
  int blocks() const override { return static_cast<int>(blocks_.size()); }
  /// The stem: convolution, BatchNorm, ReLU (and max pool).
  torch::Tensor embed(const torch::Tensor& images) override;
  torch::Tensor run_blocks(torch::Tensor x, int begin, int end) override;
  /// Global average pooling, dropout and the heads.
  ModelOutput head(const torch::Tensor& x) override;
  /// "layer<s>.<j>." the j-th block of stage s; "fc.", "regression_head." the head; the rest
  /// (conv1, bn1) the embedding.
  int piece_of(const std::string& name) const override;

 private:
  bool stem_pool_ = true;
  torch::nn::Conv2d conv1_{nullptr};
  torch::nn::BatchNorm2d bn1_{nullptr};
  std::vector<torch::nn::Sequential> layers_;
  std::vector<BasicBlock> blocks_;  // the layers' blocks, in order
  torch::nn::Linear fc_{nullptr};
  torch::nn::Linear regression_head_{nullptr};  // null without a regression head
};
class ResNet : public ConcreteModel<ResNetImpl> {
 public:
  using ConcreteModel<ResNetImpl>::ConcreteModel;
};

}  // namespace flowtrain::train
