#include "stages/train/models/model.hpp"

#include "distributed/torch_compat.hpp"
#include <torch/torch.h>

#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <sstream>

#include "graph/error.hpp"

namespace flowtrain::train {

namespace {

// Constant-initialized (no std::vector), so registrars may read it during static
// initialisation.
struct Preset {
  const char* name;
  const char* arch;
  int dim, depth, heads, patch;
  std::array<int, 4> stage_blocks;  // ResNet; {} for a ViT
};
constexpr Preset kPresets[] = {
    {"vit_ti", "vit", 192, 12, 3, 16, {}},
    {"vit_s", "vit", 384, 12, 6, 16, {}},
    {"vit_b", "vit", 768, 12, 12, 16, {}},
    {"vit_cpu_teacher", "vit", 384, 6, 6, 16, {}},
    {"vit_cpu_student", "vit", 192, 4, 3, 16, {}},
    {"resnet18", "resnet", 64, 0, 0, 0, {2, 2, 2, 2}},
    {"resnet34", "resnet", 64, 0, 0, 0, {3, 4, 6, 3}},
};

std::string field_error(const std::string& field, const std::string& why) {
  return "ModelConfig: " + field + " " + why;
}

void require_positive(const char* field, int value) {
  if (value <= 0) throw Error(field_error(field, "must be > 0 (got " + std::to_string(value) + ")"));
}

// A field another arch uses must keep its default here.
void require_unset(const ModelConfig& c, const char* field, bool is_set) {
  if (is_set) throw Error(field_error(field, "does not apply to arch '" + c.arch + "'"));
}

std::int64_t conv_flops(std::int64_t kernel, std::int64_t in, std::int64_t out, std::int64_t side) {
  return 2 * kernel * kernel * in * out * side * side;
}

// A convolution of stride 2 whose padding keeps it centred (3x3 pad 1, 7x7 pad 3, 1x1 pad 0),
// or a 3x3 max pool of stride 2 with padding 1: ceil(side / 2).
std::int64_t halved(std::int64_t side) { return (side + 1) / 2; }

std::int64_t resnet_stem_flops(const ModelConfig& c, const ResNetLayout& layout) {
  return conv_flops(layout.stem_kernel, c.channels, c.dim, halved(c.image_size));
}

std::int64_t resnet_forward_flops(const ModelConfig& c) {
  const ResNetLayout layout = resnet_layout(c);
  std::int64_t flops = resnet_stem_flops(c, layout);
  std::int64_t side = layout.stem_pool ? halved(halved(c.image_size)) : halved(c.image_size);
  std::int64_t width = c.dim;
  for (const auto& stage : layout.stages) {
    for (const ResNetLayout::Block& block : stage) {
      if (block.stride == 2) side = halved(side);
      flops += conv_flops(3, block.in, block.out, side) + conv_flops(3, block.out, block.out, side);
      if (block.downsample()) flops += conv_flops(1, block.in, block.out, side);
      width = block.out;
    }
  }
  return flops + 2 * width * (c.classes + c.regression_outputs);
}

std::int64_t vit_patch_embed_flops(const ModelConfig& c) {
  return conv_flops(c.patch_size, c.channels, c.dim, c.image_size / c.patch_size);
}

std::int64_t vit_forward_flops(const ModelConfig& c) {
  const std::int64_t tokens = c.patches() + (c.distillation_token ? 2 : 1);
  const std::int64_t d = c.dim;
  const std::int64_t block = 2 * tokens * d * 3 * d          // qkv
                             + 2 * 2 * tokens * tokens * d  // q k^T and attention x v
                             + 2 * tokens * d * d           // output projection
                             + 2 * 2 * tokens * d * c.mlp_hidden();
  const std::int64_t heads = (c.distillation_token ? 2 : 1) * c.classes + c.regression_outputs;
  return vit_patch_embed_flops(c) + c.depth * block + 2 * d * heads;
}

}  // namespace

void ModelConfig::validate() const {
  require_positive("image_size", image_size);
  require_positive("channels", channels);
  if (!is_script()) require_positive("dim", dim);
  require_positive("classes", classes);
  if (regression_outputs < 0) {
    throw Error(field_error("regression_outputs",
                            "must be >= 0 (got " + std::to_string(regression_outputs) + ")"));
  }
  if (!(regression_scale > 0)) {
    throw Error(field_error("regression_scale",
                            "must be > 0 (got " + std::to_string(regression_scale) + ")"));
  }
  if (!(dropout >= 0 && dropout < 1)) {
    throw Error(field_error("dropout", "must be in [0, 1) (got " + std::to_string(dropout) + ")"));
  }
  if (!(drop_path >= 0 && drop_path < 1)) {
    throw Error(
        field_error("drop_path", "must be in [0, 1) (got " + std::to_string(drop_path) + ")"));
  }
  if (is_script()) {
    if (script.empty()) throw Error(field_error("script", "is empty (the TorchScript file)"));
    for (const auto& [field, is_set] :
         {std::pair{"patch_size", patch_size != 0}, {"dim", dim != 0}, {"depth", depth != 0},
          {"heads", heads != 0}, {"stage_blocks", !stage_blocks.empty()},
          {"dropout", dropout != 0}, {"drop_path", drop_path != 0},
          {"distillation_token", distillation_token}}) {
      require_unset(*this, field, is_set);
    }
    return;
  }
  require_unset(*this, "script", !script.empty());
  if (arch == "resnet") {
    require_unset(*this, "patch_size", patch_size != 0);
    require_unset(*this, "depth", depth != 0);
    require_unset(*this, "heads", heads != 0);
    require_unset(*this, "distillation_token", distillation_token);
    require_unset(*this, "drop_path", drop_path != 0);
    if (stage_blocks.empty()) throw Error(field_error("stage_blocks", "is empty"));
    for (int blocks : stage_blocks) require_positive("stage_blocks", blocks);
    if (stem != "imagenet" && stem != "compact") {
      throw Error(field_error("stem", "must be imagenet or compact (got '" + stem + "')"));
    }
    if ((std::int64_t{dim} << (stage_blocks.size() - 1)) > (1 << 20)) {
      throw Error(field_error("dim", "doubled over " + std::to_string(stage_blocks.size()) +
                                         " stages is too wide"));
    }
    return;
  }
  if (arch != "vit") {
    throw Error(field_error("arch", "must be vit, resnet or torchscript (got '" + arch + "')"));
  }
  require_positive("patch_size", patch_size);
  require_positive("depth", depth);
  require_positive("heads", heads);
  require_unset(*this, "stage_blocks", !stage_blocks.empty());
  if (!(mlp_ratio > 0)) {
    throw Error(field_error("mlp_ratio", "must be > 0 (got " + std::to_string(mlp_ratio) + ")"));
  }
  if (mlp_hidden() <= 0) {
    throw Error("ModelConfig: mlp_ratio " + std::to_string(mlp_ratio) + " x dim " +
                std::to_string(dim) + " gives an empty MLP");
  }
  if (image_size % patch_size != 0) {
    throw Error("ModelConfig: image_size " + std::to_string(image_size) +
                " is not divisible by patch_size " + std::to_string(patch_size));
  }
  if (dim % heads != 0) {
    throw Error("ModelConfig: dim " + std::to_string(dim) + " is not divisible by heads " +
                std::to_string(heads));
  }
}

std::int64_t ModelConfig::patches() const {
  const std::int64_t side = image_size / patch_size;
  return side * side;
}

std::int64_t ModelConfig::mlp_hidden() const { return static_cast<std::int64_t>(mlp_ratio * dim); }

std::int64_t ModelConfig::forward_flops() const {
  if (is_script()) return 0;
  return is_vit() ? vit_forward_flops(*this) : resnet_forward_flops(*this);
}

std::int64_t ModelConfig::train_flops() const {
  if (is_script()) return 0;
  // The first layer's gradient with respect to the images is not computed.
  const std::int64_t first =
      is_vit() ? vit_patch_embed_flops(*this) : resnet_stem_flops(*this, resnet_layout(*this));
  return 3 * forward_flops() - first;
}

std::int64_t ModelConfig::min_parameters() const {
  // In long double: a damaged config's fields may multiply past 64 bits.
  using Real = long double;
  const Real heads_out = Real(classes) * (distillation_token ? 2 : 1) + regression_outputs;
  Real n = 0;
  if (is_script()) {
    return 0;
  } else if (is_vit()) {
    const Real d = dim;
    n = Real(channels) * patch_size * patch_size * d +
        Real(depth) * (4 * d * d + 2 * d * std::floor(Real(mlp_ratio) * d)) + heads_out * d;
  } else {
    Real width = dim;
    for (const int blocks : stage_blocks) {
      n += Real(blocks) * 9 * width * width;
      width *= 2;
    }
    n += heads_out * (width / 2);
  }
  constexpr Real kMax = Real(std::numeric_limits<std::int64_t>::max());
  return n >= kMax ? std::numeric_limits<std::int64_t>::max() : static_cast<std::int64_t>(n);
}

std::string ModelConfig::describe() const {
  std::ostringstream out;
  if (is_script()) {
    out << "TorchScript " << script;
  } else if (is_vit()) {
    out << "ViT dim " << dim << " depth " << depth << " heads " << heads << " patch "
        << patch_size << (distillation_token ? " with distillation token" : "");
  } else {
    out << "ResNet width " << dim << " blocks ";
    for (std::size_t s = 0; s < stage_blocks.size(); ++s) out << (s ? "-" : "") << stage_blocks[s];
    out << " (" << stem << " stem)";
  }
  return out.str();
}

const std::vector<std::string>& model_presets() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const Preset& p : kPresets) out.emplace_back(p.name);
    return out;
  }();
  return names;
}

ModelConfig model_config(const std::string& preset, int image_size, int classes) {
  for (const Preset& p : kPresets) {
    if (preset == p.name) {
      return ModelConfig{.arch = p.arch,
                         .image_size = image_size,
                         .patch_size = p.patch,
                         .dim = p.dim,
                         .depth = p.depth,
                         .heads = p.heads,
                         .classes = classes,
                         .stage_blocks = p.stage_blocks[0] == 0
                                             ? std::vector<int>()
                                             : std::vector<int>(p.stage_blocks.begin(),
                                                                p.stage_blocks.end())};
    }
  }
  std::string known;
  for (const std::string& name : model_presets()) known += (known.empty() ? "" : ", ") + name;
  throw Error("unknown model preset '" + preset + "' (known: " + known + ")");
}

ResNetLayout resnet_layout(const ModelConfig& config) {
  ResNetLayout layout;
  if (config.stem == "compact") layout = {.stem_kernel = 3, .stem_padding = 1, .stem_pool = false};
  std::int64_t in = config.dim;
  for (std::size_t s = 0; s < config.stage_blocks.size(); ++s) {
    const std::int64_t width = std::int64_t{config.dim} << s;
    std::vector<ResNetLayout::Block>& stage = layout.stages.emplace_back();
    for (int b = 0; b < config.stage_blocks[s]; ++b) {
      stage.push_back({"layer" + std::to_string(s + 1) + "." + std::to_string(b), in, width,
                       b == 0 && s > 0 ? 2 : 1});
      in = width;
    }
  }
  return layout;
}

ImageModelImpl::ImageModelImpl(ModelConfig config) : config_(std::move(config)) {
  config_.validate();
}

void ImageModelImpl::check_images(const torch::Tensor& images) const {
  if (images.dim() != 4 || images.size(1) != config_.channels ||
      images.size(2) != config_.image_size || images.size(3) != config_.image_size) {
    std::ostringstream message;
    message << (config_.is_script() ? config_.script : config_.is_vit() ? "ViT" : "ResNet")
            << ": expected images [B, "
            << config_.channels << ", " << config_.image_size << ", " << config_.image_size
            << "], got " << images.sizes();
    throw Error(message.str());
  }
}

torch::Tensor ImageModelImpl::scale_regression(torch::Tensor regression) const {
  return config_.regression_scale == 1 ? regression : regression * config_.regression_scale;
}

namespace {
std::map<std::string, ArchitectureMaker>& architectures() {
  static std::map<std::string, ArchitectureMaker> makers;
  return makers;
}
}  // namespace

bool register_architecture(const char* arch, ArchitectureMaker make) {
  architectures()[arch] = make;
  return true;
}

ImageModel make_model(const ModelConfig& config) {
  const auto it = architectures().find(config.arch);
  if (it == architectures().end()) {
    throw Error("model '" + config.arch + "': no such architecture is registered");
  }
  // As the base class's pointer: ModuleHolder's other constructors would build an
  // ImageModelImpl itself.
  return ImageModel(it->second(config));
}

torch::Tensor apply_linear(torch::nn::Linear& layer, const torch::Tensor& x) {
  if (!dist::autocast_enabled(c10::DeviceType::CPU)) return layer->forward(x);
  const torch::Tensor& bias = layer->bias;
  return torch::linear(x, layer->weight, bias.defined() ? bias.to(torch::kBFloat16) : bias);
}

std::int64_t parameter_count(const torch::nn::Module& module) {
  std::int64_t count = 0;
  for (const torch::Tensor& parameter : module.parameters(/*recurse=*/true)) {
    count += parameter.numel();
  }
  return count;
}

}  // namespace flowtrain::train
