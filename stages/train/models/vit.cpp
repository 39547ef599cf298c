#include "stages/train/models/vit.hpp"

#include <torch/torch.h>

#include <cmath>

#include "distributed/torch_compat.hpp"
#include "graph/error.hpp"

namespace flowtrain::train {

namespace {

constexpr double kInitStd = 0.02;
// timm's LayerNorm epsilon for ViT (PyTorch's default is 1e-5).
constexpr double kLayerNormEps = 1e-6;

// Truncated normal at [-2 std, 2 std] by the inverse CDF, as torch.nn.init.trunc_normal_ does;
// LibTorch's C++ frontend has no trunc_normal_. (timm passes the bounds -2 and 2 in absolute
// units, which at std 0.02 truncates nothing; we truncate at two standard deviations.)
void trunc_normal_(torch::Tensor tensor, double std) {
  torch::NoGradGuard no_grad;
  const auto normal_cdf = [](double x) { return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))); };
  const double low = normal_cdf(-2.0);
  const double high = normal_cdf(2.0);
  tensor.uniform_(2.0 * low - 1.0, 2.0 * high - 1.0);
  tensor.erfinv_();
  tensor.mul_(std * std::sqrt(2.0));
  tensor.clamp_(-2.0 * std, 2.0 * std);
}

torch::nn::LayerNorm layer_norm(std::int64_t dim) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim}).eps(kLayerNormEps));
}

torch::Tensor maybe_dropout(const torch::Tensor& x, double p, bool training) {
  return p > 0 ? torch::dropout(x, p, training) : x;
}

}  // namespace

PatchEmbedImpl::PatchEmbedImpl(std::int64_t channels, std::int64_t dim, std::int64_t patch)
    : patch_(patch),
      proj_(register_module(
          "proj",
          torch::nn::Conv2d(torch::nn::Conv2dOptions(channels, dim, patch).stride(patch)))) {}

torch::Tensor PatchEmbedImpl::forward(const torch::Tensor& images) {
  const c10::DeviceType device = images.device().type();
  // [B, dim, H/p, W/p] -> [B, patches, dim]
  if (!dist::autocast_enabled(device)) return proj_(images).flatten(2).transpose(1, 2);
  // [B, C, H, W] -> [B, H/p, W/p, C, p, p] in the autocast dtype, in one pass (a copy that
  // casts), then [B, patches, C * p * p] times the kernel's rows.
  const std::int64_t batch = images.size(0), channels = images.size(1);
  const std::int64_t rows = images.size(2) / patch_, columns = images.size(3) / patch_;
  const torch::Tensor patches =
      torch::empty({batch, rows, columns, channels, patch_, patch_},
                   images.options().dtype(dist::autocast_dtype(device)))
          .copy_(images.reshape({batch, channels, rows, patch_, columns, patch_})
                     .permute({0, 2, 4, 1, 3, 5}))
          .view({batch, rows * columns, channels * patch_ * patch_});
  return torch::linear(patches, proj_->weight.flatten(1), proj_->bias.to(patches.scalar_type()));
}

AttentionImpl::AttentionImpl(std::int64_t dim, std::int64_t heads, double dropout)
    : heads_(heads),
      scale_(1.0 / std::sqrt(static_cast<double>(dim / heads))),
      dropout_(dropout),
      qkv_(register_module("qkv", torch::nn::Linear(dim, 3 * dim))),
      proj_(register_module("proj", torch::nn::Linear(dim, dim))) {}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x) {
  const std::int64_t batch = x.size(0);
  const std::int64_t tokens = x.size(1);
  const std::int64_t dim = x.size(2);
  // [B, N, 3 * dim] -> [3, B, heads, N, head_dim]
  const torch::Tensor qkv =
      apply_linear(qkv_, x).reshape({batch, tokens, 3, heads_, dim / heads_}).permute({2, 0, 3, 1, 4});
  const torch::Tensor q = qkv[0];
  const torch::Tensor k = qkv[1];
  const torch::Tensor v = qkv[2];
  const torch::Tensor attention = torch::matmul(q * scale_, k.transpose(-2, -1)).softmax(-1);
  const torch::Tensor out =
      torch::matmul(attention, v).transpose(1, 2).reshape({batch, tokens, dim});
  return maybe_dropout(apply_linear(proj_, out), dropout_, is_training());
}

MlpImpl::MlpImpl(std::int64_t dim, std::int64_t hidden, double dropout)
    : dropout_(dropout),
      fc1_(register_module("fc1", torch::nn::Linear(dim, hidden))),
      fc2_(register_module("fc2", torch::nn::Linear(hidden, dim))) {}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) {
  // Exact (erf) GELU, as torch.nn.GELU() in timm.
  const torch::Tensor hidden = maybe_dropout(torch::gelu(apply_linear(fc1_, x)), dropout_, is_training());
  return maybe_dropout(apply_linear(fc2_, hidden), dropout_, is_training());
}

TransformerBlockImpl::TransformerBlockImpl(std::int64_t dim,
                                           std::int64_t heads,
                                           std::int64_t hidden,
                                           double dropout,
                                           double drop_path)
    : drop_path_(drop_path),
      norm1_(register_module("norm1", layer_norm(dim))),
      attn_(register_module("attn", Attention(dim, heads, dropout))),
      norm2_(register_module("norm2", layer_norm(dim))),
      mlp_(register_module("mlp", Mlp(dim, hidden, dropout))) {}

torch::Tensor TransformerBlockImpl::drop_path(const torch::Tensor& branch) const {
  if (drop_path_ == 0 || !is_training()) return branch;
  // One draw per sample from the global generator (seeded and checkpointed by the Trainer).
  const double keep = 1.0 - drop_path_;
  std::vector<std::int64_t> shape(static_cast<std::size_t>(branch.dim()), 1);
  shape[0] = branch.size(0);
  const torch::Tensor mask =
      torch::empty(shape, branch.options().dtype(torch::kFloat)).bernoulli_(keep).div_(keep);
  return branch * mask.to(branch.scalar_type());
}

torch::Tensor TransformerBlockImpl::forward(torch::Tensor x) {
  x = x + drop_path(attn_(norm1_(x)));
  return x + drop_path(mlp_(norm2_(x)));
}

ViTImpl::ViTImpl(const ModelConfig& config) : ImageModelImpl(config) {
  if (!config_.is_vit()) throw Error("ViT: config.arch is '" + config_.arch + "', not 'vit'");
  const std::int64_t dim = config_.dim;
  const std::int64_t extra_tokens = config_.distillation_token ? 2 : 1;
  patch_embed_ =
      register_module("patch_embed", PatchEmbed(config_.channels, dim, config_.patch_size));
  cls_token_ = register_parameter("cls_token", torch::zeros({1, 1, dim}));
  if (config_.distillation_token) {
    dist_token_ = register_parameter("dist_token", torch::zeros({1, 1, dim}));
  }
  pos_embed_ =
      register_parameter("pos_embed", torch::zeros({1, extra_tokens + config_.patches(), dim}));
  blocks_ = register_module("blocks", torch::nn::ModuleList());
  for (int i = 0; i < config_.depth; ++i) {
    const double rate = config_.depth > 1 ? config_.drop_path * i / (config_.depth - 1) : 0.0;
    blocks_->push_back(
        TransformerBlock(dim, config_.heads, config_.mlp_hidden(), config_.dropout, rate));
  }
  norm_ = register_module("norm", layer_norm(dim));
  head_ = register_module("head", torch::nn::Linear(dim, config_.classes));
  if (config_.distillation_token) {
    head_dist_ = register_module("head_dist", torch::nn::Linear(dim, config_.classes));
  }
  if (config_.regression_outputs > 0) {
    regression_head_ =
        register_module("regression_head", torch::nn::Linear(dim, config_.regression_outputs));
  }
  init_parameters();
}

void ViTImpl::init_parameters() {
  torch::NoGradGuard no_grad;
  trunc_normal_(pos_embed_, kInitStd);
  trunc_normal_(cls_token_, kInitStd);
  if (dist_token_.defined()) trunc_normal_(dist_token_, kInitStd);
  // modules() lists submodules depth first in registration order, so the draws are deterministic.
  // The patch embedding keeps LibTorch's default Conv2d init, as in timm; LayerNorm is 1 and 0.
  for (const auto& module : modules(/*include_self=*/false)) {
    if (auto* linear = module->as<torch::nn::Linear>()) {
      trunc_normal_(linear->weight, kInitStd);
      linear->bias.zero_();
    }
  }
}

ModelOutput ViTImpl::forward(const torch::Tensor& images) {
  return head(run_blocks(embed(images), 0, static_cast<int>(blocks_->size())));
}

torch::Tensor ViTImpl::embed(const torch::Tensor& images) {
  check_images(images);
  torch::Tensor x = patch_embed_(images);
  const std::int64_t batch = x.size(0);
  x = config_.distillation_token
          ? torch::cat({cls_token_.expand({batch, -1, -1}), dist_token_.expand({batch, -1, -1}), x},
                       1)
          : torch::cat({cls_token_.expand({batch, -1, -1}), x}, 1);
  return maybe_dropout(x + pos_embed_, config_.dropout, is_training());
}

torch::Tensor ViTImpl::run_blocks(torch::Tensor x, int begin, int end) {
  for (int i = begin; i < end; ++i) {
    x = blocks_[static_cast<std::size_t>(i)]->as<TransformerBlock>()->forward(x);
  }
  return x;
}

int ViTImpl::piece_of(const std::string& name) const {
  if (name.rfind("blocks.", 0) == 0) return 1 + std::stoi(name.substr(7));
  if (name.rfind("norm.", 0) == 0 || name.rfind("head", 0) == 0 ||
      name.rfind("regression_head.", 0) == 0) {
    return blocks() + 1;
  }
  return 0;
}

ModelOutput ViTImpl::head(const torch::Tensor& x) {
  // LayerNorm is per token: normalising the class token alone equals timm's norm-then-select.
  const torch::Tensor cls = norm_(x.select(1, 0));
  ModelOutput out;
  out.logits = apply_linear(head_, cls);
  if (head_dist_) {
    const torch::Tensor distillation = apply_linear(head_dist_, norm_(x.select(1, 1)));
    if (is_training()) {
      out.distillation = distillation;
    } else {
      out.logits = (out.logits + distillation) / 2;
    }
  }
  if (regression_head_) out.regression = scale_regression(apply_linear(regression_head_, cls));
  return out;
}

namespace {
// make_model's "vit" (model.hpp).
[[maybe_unused]] const bool kRegistered = register_architecture(
    "vit",
    [](const ModelConfig& config) -> std::shared_ptr<ImageModelImpl> { return ViT(config).ptr(); });
}  // namespace

}  // namespace flowtrain::train
