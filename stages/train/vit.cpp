#include "stages/train/vit.hpp"

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <cmath>
#include <sstream>

#include "graph/error.hpp"

namespace flowtrain::train {

namespace {

constexpr double kInitStd = 0.02;
// timm's LayerNorm epsilon for ViT (PyTorch's default is 1e-5).
constexpr double kLayerNormEps = 1e-6;

struct Preset {
  const char* name;
  int dim, depth, heads, patch;
};
constexpr Preset kPresets[] = {
    {"vit_ti", 192, 12, 3, 16},         {"vit_s", 384, 12, 6, 16},
    {"vit_b", 768, 12, 12, 16},         {"vit_cpu_teacher", 384, 6, 6, 16},
    {"vit_cpu_student", 192, 4, 3, 16},
};

void require_positive(const char* field, int value) {
  if (value <= 0) {
    throw Error(std::string("ViTConfig: ") + field + " must be > 0 (got " + std::to_string(value) +
                ")");
  }
}

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

// A Linear layer, with its bias in bf16 under autocast. LibTorch 1.13's CPU autocast casts the
// input and the weight of a linear to bf16 but leaves the bias float32, then adds it to the
// bf16 product in a separate mixed-type pass (6% of the bench teacher's bf16 forward); with a
// bf16 bias at::linear fuses it into one addmm. Outside autocast this is exactly layer(x).
torch::Tensor linear(torch::nn::Linear& layer, const torch::Tensor& x) {
  if (!at::autocast::is_cpu_enabled()) return layer->forward(x);
  const torch::Tensor& bias = layer->bias;
  return torch::linear(x, layer->weight, bias.defined() ? bias.to(torch::kBFloat16) : bias);
}

torch::Tensor maybe_dropout(const torch::Tensor& x, double p, bool training) {
  return p > 0 ? torch::dropout(x, p, training) : x;
}

}  // namespace

void ViTConfig::validate() const {
  require_positive("image_size", image_size);
  require_positive("patch_size", patch_size);
  require_positive("channels", channels);
  require_positive("dim", dim);
  require_positive("depth", depth);
  require_positive("heads", heads);
  require_positive("classes", classes);
  if (!(mlp_ratio > 0)) {
    throw Error("ViTConfig: mlp_ratio must be > 0 (got " + std::to_string(mlp_ratio) + ")");
  }
  if (mlp_hidden() <= 0) {
    throw Error("ViTConfig: mlp_ratio " + std::to_string(mlp_ratio) + " x dim " +
                std::to_string(dim) + " gives an empty MLP");
  }
  if (regression_outputs < 0) {
    throw Error("ViTConfig: regression_outputs must be >= 0 (got " +
                std::to_string(regression_outputs) + ")");
  }
  if (!(regression_scale > 0)) {
    throw Error("ViTConfig: regression_scale must be > 0 (got " + std::to_string(regression_scale) +
                ")");
  }
  if (!(dropout >= 0 && dropout < 1)) {
    throw Error("ViTConfig: dropout must be in [0, 1) (got " + std::to_string(dropout) + ")");
  }
  if (image_size % patch_size != 0) {
    throw Error("ViTConfig: image_size " + std::to_string(image_size) +
                " is not divisible by patch_size " + std::to_string(patch_size));
  }
  if (dim % heads != 0) {
    throw Error("ViTConfig: dim " + std::to_string(dim) + " is not divisible by heads " +
                std::to_string(heads));
  }
}

std::int64_t ViTConfig::patches() const {
  const std::int64_t side = image_size / patch_size;
  return side * side;
}

std::int64_t ViTConfig::mlp_hidden() const { return static_cast<std::int64_t>(mlp_ratio * dim); }

namespace {

std::int64_t patch_embed_flops(const ViTConfig& c) {
  return 2 * c.patches() * c.channels * c.patch_size * c.patch_size * c.dim;
}

}  // namespace

std::int64_t ViTConfig::forward_flops() const {
  const std::int64_t tokens = patches() + 1;
  const std::int64_t d = dim;
  const std::int64_t block = 2 * tokens * d * 3 * d          // qkv
                             + 2 * 2 * tokens * tokens * d  // q k^T and attention x v
                             + 2 * tokens * d * d           // output projection
                             + 2 * 2 * tokens * d * mlp_hidden();
  return patch_embed_flops(*this) + depth * block + 2 * d * (classes + regression_outputs);
}

std::int64_t ViTConfig::train_flops() const {
  return 3 * forward_flops() - patch_embed_flops(*this);
}

ViTConfig vit_config(const std::string& preset, int image_size, int classes) {
  std::string known;
  for (const Preset& p : kPresets) {
    if (preset == p.name) {
      return ViTConfig{.image_size = image_size,
                       .patch_size = p.patch,
                       .dim = p.dim,
                       .depth = p.depth,
                       .heads = p.heads,
                       .classes = classes};
    }
    known += known.empty() ? "" : ", ";
    known += p.name;
  }
  throw Error("unknown ViT preset '" + preset + "' (known: " + known + ")");
}

PatchEmbedImpl::PatchEmbedImpl(std::int64_t channels, std::int64_t dim, std::int64_t patch)
    : proj_(register_module(
          "proj",
          torch::nn::Conv2d(torch::nn::Conv2dOptions(channels, dim, patch).stride(patch)))) {}

torch::Tensor PatchEmbedImpl::forward(const torch::Tensor& images) {
  // [B, dim, H/p, W/p] -> [B, patches, dim]
  return proj_(images).flatten(2).transpose(1, 2);
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
      linear(qkv_, x).reshape({batch, tokens, 3, heads_, dim / heads_}).permute({2, 0, 3, 1, 4});
  const torch::Tensor q = qkv[0];
  const torch::Tensor k = qkv[1];
  const torch::Tensor v = qkv[2];
  const torch::Tensor attention = torch::matmul(q * scale_, k.transpose(-2, -1)).softmax(-1);
  const torch::Tensor out =
      torch::matmul(attention, v).transpose(1, 2).reshape({batch, tokens, dim});
  return maybe_dropout(linear(proj_, out), dropout_, is_training());
}

MlpImpl::MlpImpl(std::int64_t dim, std::int64_t hidden, double dropout)
    : dropout_(dropout),
      fc1_(register_module("fc1", torch::nn::Linear(dim, hidden))),
      fc2_(register_module("fc2", torch::nn::Linear(hidden, dim))) {}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) {
  // Exact (erf) GELU, as torch.nn.GELU() in timm.
  const torch::Tensor hidden = maybe_dropout(torch::gelu(linear(fc1_, x)), dropout_, is_training());
  return maybe_dropout(linear(fc2_, hidden), dropout_, is_training());
}

TransformerBlockImpl::TransformerBlockImpl(std::int64_t dim,
                                           std::int64_t heads,
                                           std::int64_t hidden,
                                           double dropout)
    : norm1_(register_module("norm1", layer_norm(dim))),
      attn_(register_module("attn", Attention(dim, heads, dropout))),
      norm2_(register_module("norm2", layer_norm(dim))),
      mlp_(register_module("mlp", Mlp(dim, hidden, dropout))) {}

torch::Tensor TransformerBlockImpl::forward(torch::Tensor x) {
  x = x + attn_(norm1_(x));
  return x + mlp_(norm2_(x));
}

ViTImpl::ViTImpl(const ViTConfig& config) : config_(config) {
  config_.validate();
  const std::int64_t dim = config_.dim;
  patch_embed_ =
      register_module("patch_embed", PatchEmbed(config_.channels, dim, config_.patch_size));
  cls_token_ = register_parameter("cls_token", torch::zeros({1, 1, dim}));
  pos_embed_ = register_parameter("pos_embed", torch::zeros({1, 1 + config_.patches(), dim}));
  blocks_ = register_module("blocks", torch::nn::ModuleList());
  for (int i = 0; i < config_.depth; ++i) {
    blocks_->push_back(TransformerBlock(dim, config_.heads, config_.mlp_hidden(), config_.dropout));
  }
  norm_ = register_module("norm", layer_norm(dim));
  head_ = register_module("head", torch::nn::Linear(dim, config_.classes));
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
  // modules() lists submodules depth first in registration order, so the draws are deterministic.
  // The patch embedding keeps LibTorch's default Conv2d init, as in timm; LayerNorm is 1 and 0.
  for (const auto& module : modules(/*include_self=*/false)) {
    if (auto* linear = module->as<torch::nn::Linear>()) {
      trunc_normal_(linear->weight, kInitStd);
      linear->bias.zero_();
    }
  }
}

ViTOutput ViTImpl::forward(const torch::Tensor& images) {
  if (images.dim() != 4 || images.size(1) != config_.channels ||
      images.size(2) != config_.image_size || images.size(3) != config_.image_size) {
    std::ostringstream message;
    message << "ViT: expected images [B, " << config_.channels << ", " << config_.image_size << ", "
            << config_.image_size << "], got " << images.sizes();
    throw Error(message.str());
  }
  torch::Tensor x = patch_embed_(images);
  x = torch::cat({cls_token_.expand({x.size(0), -1, -1}), x}, 1) + pos_embed_;
  x = maybe_dropout(x, config_.dropout, is_training());
  for (const auto& block : *blocks_) {
    x = block->as<TransformerBlock>()->forward(x);
  }
  // LayerNorm is per token: normalising the class token alone equals timm's norm-then-select.
  const torch::Tensor cls = norm_(x.select(1, 0));
  ViTOutput out;
  out.logits = linear(head_, cls);
  if (regression_head_) {
    out.regression = linear(regression_head_, cls);
    if (config_.regression_scale != 1) out.regression = out.regression * config_.regression_scale;
  }
  return out;
}

std::int64_t parameter_count(const torch::nn::Module& module) {
  std::int64_t count = 0;
  for (const torch::Tensor& parameter : module.parameters(/*recurse=*/true)) {
    count += parameter.numel();
  }
  return count;
}

}  // namespace flowtrain::train
