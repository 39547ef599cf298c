#include "stages/train/models/resnet.hpp"

#include <torch/torch.h>

#include "distributed/torch_compat.hpp"
#include "graph/error.hpp"

namespace flowtrain::train {

namespace {

torch::nn::Conv2d conv(std::int64_t in,
                       std::int64_t out,
                       std::int64_t kernel,
                       std::int64_t stride,
                       std::int64_t padding) {
  return torch::nn::Conv2d(
      torch::nn::Conv2dOptions(in, out, kernel).stride(stride).padding(padding).bias(false));
}

}  // namespace

BasicBlockImpl::BasicBlockImpl(std::int64_t in, std::int64_t out, std::int64_t stride)
    : conv1_(register_module("conv1", conv(in, out, 3, stride, 1))),
      bn1_(register_module("bn1", torch::nn::BatchNorm2d(out))),
      conv2_(register_module("conv2", conv(out, out, 3, 1, 1))),
      bn2_(register_module("bn2", torch::nn::BatchNorm2d(out))) {
  if (ResNetLayout::Block{.in = in, .out = out, .stride = stride}.downsample()) {
    downsample_ = register_module(
        "downsample", torch::nn::Sequential(conv(in, out, 1, stride, 0), torch::nn::BatchNorm2d(out)));
  }
  torch::NoGradGuard no_grad;
  bn2_->weight.zero_();
}

torch::Tensor BasicBlockImpl::forward(const torch::Tensor& x) {
  torch::Tensor y = torch::relu(bn1_(conv1_(x)));
  y = bn2_(conv2_(y));
  return torch::relu(y + (downsample_ ? downsample_->forward(x) : x));
}

ResNetImpl::ResNetImpl(const ModelConfig& config) : ImageModelImpl(config) {
  if (config_.arch != "resnet") {
    throw Error("ResNet: config.arch is '" + config_.arch + "', not 'resnet'");
  }
  const ResNetLayout layout = resnet_layout(config_);
  conv1_ = register_module("conv1", conv(config_.channels, config_.dim, layout.stem_kernel, 2,
                                         layout.stem_padding));
  bn1_ = register_module("bn1", torch::nn::BatchNorm2d(config_.dim));
  std::int64_t width = config_.dim;
  for (std::size_t s = 0; s < layout.stages.size(); ++s) {
    torch::nn::Sequential layer;
    for (const ResNetLayout::Block& block : layout.stages[s]) {
      blocks_.emplace_back(block.in, block.out, block.stride);
      layer->push_back(blocks_.back());
      width = block.out;
    }
    layers_.push_back(register_module("layer" + std::to_string(s + 1), layer));
  }
  stem_pool_ = layout.stem_pool;
  fc_ = register_module("fc", torch::nn::Linear(width, config_.classes));
  if (config_.regression_outputs > 0) {
    regression_head_ =
        register_module("regression_head", torch::nn::Linear(width, config_.regression_outputs));
  }
  // modules() lists submodules depth first in registration order, so the draws are deterministic.
  torch::NoGradGuard no_grad;
  for (const auto& module : modules(/*include_self=*/false)) {
    if (auto* c = module->as<torch::nn::Conv2d>()) {
      torch::nn::init::kaiming_normal_(c->weight, 0.0, torch::kFanOut, torch::kReLU);
    }
  }
}

ModelOutput ResNetImpl::forward(const torch::Tensor& images) {
  return head(run_blocks(embed(images), 0, blocks()));
}

torch::Tensor ResNetImpl::embed(const torch::Tensor& images) {
  check_images(images);
  // Under autocast (bf16 on the CPU, 16-bit on a GPU) the activations are channels-last, the
  // layout oneDNN and cuDNN convolve fastest; NCHW costs a reorder on each side of every
  // convolution (foodtag's teacher at 96 px on Zen 4: a bf16 training step ~1.15x as fast,
  // inference ~1.3x). Each operator keeps its input's layout, so the whole network runs so; the
  // parameters, their gradients and checkpoints stay as they are. Float32 keeps NCHW and its sums.
  const bool channels_last = dist::autocast_enabled(images.device().type());
  torch::Tensor x = torch::relu(
      bn1_(conv1_(channels_last ? images.contiguous(torch::MemoryFormat::ChannelsLast) : images)));
  return stem_pool_ ? torch::max_pool2d(x, 3, 2, 1) : x;
}

torch::Tensor ResNetImpl::run_blocks(torch::Tensor x, int begin, int end) {
  for (int i = begin; i < end; ++i) x = blocks_[static_cast<std::size_t>(i)]->forward(x);
  return x;
}

int ResNetImpl::piece_of(const std::string& name) const {
  if (name.rfind("layer", 0) == 0) {
    const std::size_t dot = name.find('.');
    const std::size_t stage = std::stoul(name.substr(5, dot - 5)) - 1;
    int before = 0;  // blocks of the stages before
    for (std::size_t s = 0; s < stage; ++s) before += static_cast<int>(layers_[s]->size());
    return 1 + before + std::stoi(name.substr(dot + 1));
  }
  if (name.rfind("fc.", 0) == 0 || name.rfind("regression_head.", 0) == 0) return blocks() + 1;
  return 0;
}

ModelOutput ResNetImpl::head(const torch::Tensor& features) {
  torch::Tensor x = features.mean({2, 3});
  if (config_.dropout > 0) x = torch::dropout(x, config_.dropout, is_training());
  ModelOutput out;
  out.logits = apply_linear(fc_, x);
  if (regression_head_) out.regression = scale_regression(apply_linear(regression_head_, x));
  return out;
}

namespace {
// make_model's "resnet" (model.hpp).
[[maybe_unused]] const bool kRegistered = register_architecture(
    "resnet", [](const ModelConfig& config) -> std::shared_ptr<ImageModelImpl> {
      return ResNet(config).ptr();
    });
}  // namespace

}  // namespace flowtrain::train
