#include "stages/train/files/torchscript.hpp"

#include <torch/script.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include "graph/atomic_file.hpp"
#include "graph/error.hpp"
#include "stages/train/files/bytes_reader.hpp"
#include "stages/train/files/checkpoint.hpp"
#include "stages/train/files/torch_error.hpp"
#include "stages/train/files/zip_check.hpp"
#include "stages/train/models/resnet.hpp"
#include "stages/train/models/scripted_student.hpp"

namespace flowtrain::train {

namespace {

// The TorchScript classes of the exported model, one per kind of module, in the namespace
// "__torch__.flowtrain.<arch>.". Instances of a kind share one class type (as torch.jit.script
// gives identical submodules), so each method is compiled once. The names only need to be
// unique inside the file; they show in Python's repr.

// Methods, compiled by the TorchScript frontend from source: only aten builtins (torch.*) and
// tensor methods, which the saved file records as plain TorchScript code, the same as
// torch.jit.script would write (the file format is LibTorch 1.13's: version 10, so a PyTorch
// older than the writer may refuse it). Each line mirrors the C++ forward in vit.cpp or
// resnet.cpp in eval mode (dropout and drop path are the identity, BatchNorm uses its running
// statistics), op for op, so the outputs are bit-identical.
// Submodules are called through `.forward`, as in TorchScript's own serialized code: a class
// built in C++ has no Python-side `__call__` for the compiler to resolve.
constexpr const char* kLinearSource = R"(
def forward(self, x: Tensor) -> Tensor:
    return torch.linear(x, self.weight, self.bias)
)";

constexpr const char* kLayerNormSource = R"(
def forward(self, x: Tensor) -> Tensor:
    return torch.layer_norm(x, [self.weight.size(0)], self.weight, self.bias, self.eps)
)";

constexpr const char* kConv2dSource = R"(
def forward(self, x: Tensor) -> Tensor:
    return torch.conv2d(x, self.weight, self.bias, [self.stride, self.stride])
)";

constexpr const char* kPatchEmbedSource = R"(
def forward(self, images: Tensor) -> Tensor:
    return self.proj.forward(images).flatten(2).transpose(1, 2)
)";

constexpr const char* kAttentionSource = R"(
def forward(self, x: Tensor) -> Tensor:
    batch = x.size(0)
    tokens = x.size(1)
    dim = x.size(2)
    qkv = self.qkv.forward(x).reshape([batch, tokens, 3, self.heads, dim // self.heads])
    qkv = qkv.permute([2, 0, 3, 1, 4])
    q = qkv[0]
    k = qkv[1]
    v = qkv[2]
    attention = torch.matmul(q * self.scale, k.transpose(-2, -1)).softmax(-1)
    out = torch.matmul(attention, v).transpose(1, 2).reshape([batch, tokens, dim])
    return self.proj.forward(out)
)";

constexpr const char* kMlpSource = R"(
def forward(self, x: Tensor) -> Tensor:
    return self.fc2.forward(torch.gelu(self.fc1.forward(x)))
)";

constexpr const char* kBlockSource = R"(
def forward(self, x: Tensor) -> Tensor:
    x = x + self.attn.forward(self.norm1.forward(x))
    return x + self.mlp.forward(self.norm2.forward(x))
)";

// The image check (`assert`: `raise` would need Python's exception classes) of a model's
// forward; {NAME} is the architecture's.
constexpr const char* kImageCheckSource = R"(
def forward(self, images: Tensor) -> {RETURN_TYPE}:
    assert images.dim() == 4 and images.size(1) == self.channels and images.size(2) == self.image_size and images.size(3) == self.image_size, "{NAME}: expected images [B, {}, {}, {}], got {}".format(self.channels, self.image_size, self.image_size, images.shape)
)";

// The ViT's trunk, with a class token (and a distillation token after it).
constexpr const char* kViTTrunkSource = R"(
    x = self.patch_embed.forward(images)
    x = torch.cat([self.cls_token.expand([x.size(0), -1, -1]), x], 1) + self.pos_embed
    x = self.blocks.forward(x)
    features = self.norm.forward(x.select(1, 0))
    logits = self.head.forward(features)
)";
constexpr const char* kDeiTTrunkSource = R"(
    x = self.patch_embed.forward(images)
    x = torch.cat([self.cls_token.expand([x.size(0), -1, -1]), self.dist_token.expand([x.size(0), -1, -1]), x], 1) + self.pos_embed
    x = self.blocks.forward(x)
    features = self.norm.forward(x.select(1, 0))
    logits = (self.head.forward(features) + self.head_dist.forward(self.norm.forward(x.select(1, 1)))) / 2
)";

constexpr const char* kBatchNormSource = R"(
def forward(self, x: Tensor) -> Tensor:
    return torch.batch_norm(x, self.weight, self.bias, self.running_mean, self.running_var, False, 0.1, self.eps, False)
)";

constexpr const char* kConvSource = R"(
def forward(self, x: Tensor) -> Tensor:
    return torch.conv2d(x, self.weight, None, [self.stride, self.stride], [self.padding, self.padding])
)";

constexpr const char* kBasicBlockSource = R"(
def forward(self, x: Tensor) -> Tensor:
    y = torch.relu(self.bn1.forward(self.conv1.forward(x)))
    y = self.bn2.forward(self.conv2.forward(y))
    return torch.relu(y + {SHORTCUT})
)";

std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (std::size_t at = text.find(from); at != std::string::npos; at = text.find(from, at)) {
    text.replace(at, from.size(), to);
    at += to.size();
  }
  return text;
}

// Builds the module tree, one class type per kind, creating each type on first use.
class ModuleBuilder {
 public:
  explicit ModuleBuilder(const std::string& arch)
      : namespace_("__torch__.flowtrain." + arch + "."),
        unit_(std::make_shared<torch::jit::CompilationUnit>()) {}

  torch::jit::Module make(const std::string& kind) {
    auto found = types_.find(kind);
    torch::jit::Module module =
        found == types_.end() ? torch::jit::Module(c10::QualifiedName(namespace_ + kind), unit_)
                              : torch::jit::Module(unit_, found->second);
    if (found == types_.end()) types_.emplace(kind, module.type());
    // Module::train()/eval() (C++ and Python) expect the attribute on every module.
    module.register_attribute("training", c10::BoolType::get(), false);
    return module;
  }

  /// Compiles `source` as methods of the class of `module`, once per class.
  void define(torch::jit::Module& module, const std::string& source) {
    if (defined_.insert(module.type()->name()->qualifiedName()).second) module.define(source);
  }

 private:
  std::string namespace_;
  std::shared_ptr<torch::jit::CompilationUnit> unit_;
  std::map<std::string, c10::ClassTypePtr> types_;
  std::set<std::string> defined_;
};

// Reads the weights (and buffers) of the C++ model by their timm or torchvision names.
class WeightSource {
 public:
  explicit WeightSource(const ImageModel& model) : config_(model->config()) {
    for (const auto& item : model->named_parameters(/*recurse=*/true)) {
      parameters_.emplace(item.key(), item.value());
    }
    for (const auto& item : model->named_buffers(/*recurse=*/true)) {
      parameters_.emplace(item.key(), item.value());
    }
    for (const auto& item : model->named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
      modules_.emplace(item.key(), item.value());
    }
  }

  /// A CPU copy of the parameter `name`, detached from the model.
  torch::Tensor copy(const std::string& name) const {
    const auto found = parameters_.find(name);
    if (found == parameters_.end()) {
      throw Error("export_torchscript: the model has no parameter '" + name + "'");
    }
    torch::NoGradGuard no_grad;
    torch::Tensor tensor = found->second.detach().to(torch::kCPU).contiguous().clone();
    tensor.set_requires_grad(found->second.requires_grad());
    return tensor;
  }

  /// The submodule `name`, which must be an `Impl` (a `kind`).
  template <class Impl>
  const Impl& module(const std::string& name, const char* kind) const {
    const auto found = modules_.find(name);
    const auto* module = found == modules_.end() ? nullptr : found->second->as<Impl>();
    if (module == nullptr) {
      throw Error(std::string("export_torchscript: the model has no ") + kind + " '" + name + "'");
    }
    return *module;
  }

  const ModelConfig& config() const { return config_; }

 private:
  ModelConfig config_;
  std::map<std::string, torch::Tensor> parameters_;
  std::map<std::string, std::shared_ptr<torch::nn::Module>> modules_;
};

void add_parameters(torch::jit::Module& module,
                    const WeightSource& weights,
                    const std::string& prefix,
                    std::initializer_list<const char*> names) {
  for (const char* name : names) {
    module.register_parameter(name, weights.copy(prefix + name), /*is_buffer=*/false);
  }
}

torch::jit::Module linear(ModuleBuilder& builder,
                          const WeightSource& weights,
                          const std::string& name) {
  torch::jit::Module module = builder.make("Linear");
  add_parameters(module, weights, name + ".", {"weight", "bias"});
  builder.define(module, kLinearSource);
  return module;
}

torch::jit::Module layer_norm(ModuleBuilder& builder,
                              const WeightSource& weights,
                              const std::string& name) {
  torch::jit::Module module = builder.make("LayerNorm");
  add_parameters(module, weights, name + ".", {"weight", "bias"});
  const double eps = weights.module<torch::nn::LayerNormImpl>(name, "LayerNorm").options.eps();
  module.register_attribute("eps", c10::FloatType::get(), eps);
  builder.define(module, kLayerNormSource);
  return module;
}

torch::jit::Module batch_norm(ModuleBuilder& builder,
                              const WeightSource& weights,
                              const std::string& name) {
  torch::jit::Module module = builder.make("BatchNorm2d");
  add_parameters(module, weights, name + ".", {"weight", "bias"});
  for (const char* buffer : {"running_mean", "running_var", "num_batches_tracked"}) {
    module.register_buffer(buffer, weights.copy(name + "." + buffer));
  }
  const double eps =
      weights.module<torch::nn::BatchNorm2dImpl>(name, "BatchNorm2d").options.eps();
  module.register_attribute("eps", c10::FloatType::get(), eps);
  builder.define(module, kBatchNormSource);
  return module;
}

torch::jit::Module conv(ModuleBuilder& builder,
                        const WeightSource& weights,
                        const std::string& name,
                        std::int64_t stride,
                        std::int64_t padding) {
  torch::jit::Module module = builder.make("Conv2d");
  add_parameters(module, weights, name + ".", {"weight"});
  module.register_attribute("stride", c10::IntType::get(), stride);
  module.register_attribute("padding", c10::IntType::get(), padding);
  builder.define(module, kConvSource);
  return module;
}

// A module of kind `kind` whose forward runs `children` (named "0", "1", ...) in order, as
// torch.nn.Sequential.
torch::jit::Module sequential(ModuleBuilder& builder,
                              const std::string& kind,
                              const std::vector<torch::jit::Module>& children) {
  torch::jit::Module module = builder.make(kind);
  std::string source = "\ndef forward(self, x: Tensor) -> Tensor:\n";
  for (std::size_t i = 0; i < children.size(); ++i) {
    module.register_module(std::to_string(i), children[i]);
    source += "    x = getattr(self, \"" + std::to_string(i) + "\").forward(x)\n";
  }
  builder.define(module, source + "    return x\n");
  return module;
}

// The attributes every exported model carries, and its forward: the image check, the trunk
// (which leaves `features` and `logits`), and the return, with or without a regression head.
void finish_model(ModuleBuilder& builder,
                  torch::jit::Module& model,
                  const WeightSource& weights,
                  const std::string& name,
                  const std::string& trunk) {
  const ModelConfig& config = weights.config();
  const bool regression = config.regression_outputs > 0;
  if (regression) {
    model.register_module("regression_head", linear(builder, weights, "regression_head"));
  }
  model.register_attribute("image_size", c10::IntType::get(), std::int64_t{config.image_size});
  model.register_attribute("channels", c10::IntType::get(), std::int64_t{config.channels});
  model.register_attribute("classes", c10::IntType::get(), std::int64_t{config.classes});
  model.register_attribute("regression_outputs", c10::IntType::get(),
                           std::int64_t{config.regression_outputs});
  model.register_attribute("regression_scale", c10::FloatType::get(), config.regression_scale);
  std::string source = replace_all(kImageCheckSource, "{NAME}", name);
  source = replace_all(source, "{RETURN_TYPE}", regression ? "Tuple[Tensor, Tensor]" : "Tensor");
  // As the C++ forward: the regression head's outputs in the targets' units.
  source += trunk + (regression ? "    return logits, "
                                  "self.regression_head.forward(features) * self.regression_scale\n"
                                : "    return logits\n");
  builder.define(model, source);
}

torch::jit::Module build_vit(const ImageModel& model) {
  const ModelConfig& config = model->config();
  const WeightSource weights(model);
  ModuleBuilder builder("vit");

  torch::jit::Module proj = builder.make("Conv2d");
  add_parameters(proj, weights, "patch_embed.proj.", {"weight", "bias"});
  proj.register_attribute("stride", c10::IntType::get(), std::int64_t{config.patch_size});
  builder.define(proj, kConv2dSource);
  torch::jit::Module patch_embed = builder.make("PatchEmbed");
  patch_embed.register_module("proj", proj);
  builder.define(patch_embed, kPatchEmbedSource);

  // blocks: a Sequential, as in timm.
  std::vector<torch::jit::Module> blocks;
  for (int i = 0; i < config.depth; ++i) {
    const std::string prefix = "blocks." + std::to_string(i) + ".";
    torch::jit::Module attn = builder.make("Attention");
    attn.register_module("qkv", linear(builder, weights, prefix + "attn.qkv"));
    attn.register_module("proj", linear(builder, weights, prefix + "attn.proj"));
    attn.register_attribute("heads", c10::IntType::get(), std::int64_t{config.heads});
    attn.register_attribute("scale", c10::FloatType::get(),
                            1.0 / std::sqrt(static_cast<double>(config.dim / config.heads)));
    builder.define(attn, kAttentionSource);
    torch::jit::Module mlp = builder.make("Mlp");
    mlp.register_module("fc1", linear(builder, weights, prefix + "mlp.fc1"));
    mlp.register_module("fc2", linear(builder, weights, prefix + "mlp.fc2"));
    builder.define(mlp, kMlpSource);
    torch::jit::Module block = builder.make("Block");
    block.register_module("norm1", layer_norm(builder, weights, prefix + "norm1"));
    block.register_module("attn", attn);
    block.register_module("norm2", layer_norm(builder, weights, prefix + "norm2"));
    block.register_module("mlp", mlp);
    builder.define(block, kBlockSource);
    blocks.push_back(block);
  }

  torch::jit::Module vit = builder.make("VisionTransformer");
  vit.register_module("patch_embed", patch_embed);
  add_parameters(vit, weights, "", {"cls_token", "pos_embed"});
  if (config.distillation_token) add_parameters(vit, weights, "", {"dist_token"});
  vit.register_module("blocks", sequential(builder, "Sequential", blocks));
  vit.register_module("norm", layer_norm(builder, weights, "norm"));
  vit.register_module("head", linear(builder, weights, "head"));
  if (config.distillation_token) vit.register_module("head_dist", linear(builder, weights, "head_dist"));
  finish_model(builder, vit, weights, "ViT",
               config.distillation_token ? kDeiTTrunkSource : kViTTrunkSource);
  return vit;
}

torch::jit::Module build_resnet(const ImageModel& model) {
  const ResNetLayout layout = resnet_layout(model->config());
  const WeightSource weights(model);
  ModuleBuilder builder("resnet");
  torch::jit::Module resnet = builder.make("ResNet");
  resnet.register_module("conv1", conv(builder, weights, "conv1", 2, layout.stem_padding));
  resnet.register_module("bn1", batch_norm(builder, weights, "bn1"));
  std::string trunk = "    x = torch.relu(self.bn1.forward(self.conv1.forward(images)))\n";
  if (layout.stem_pool) trunk += "    x = torch.max_pool2d(x, [3, 3], [2, 2], [1, 1])\n";
  for (std::size_t s = 0; s < layout.stages.size(); ++s) {
    std::vector<torch::jit::Module> blocks;
    for (const ResNetLayout::Block& b : layout.stages[s]) {
      const std::string prefix = b.name + ".";
      // With and without a shortcut projection: two kinds, as their forwards differ.
      torch::jit::Module block = builder.make(b.downsample() ? "DownsampleBlock" : "BasicBlock");
      block.register_module("conv1", conv(builder, weights, prefix + "conv1", b.stride, 1));
      block.register_module("bn1", batch_norm(builder, weights, prefix + "bn1"));
      block.register_module("conv2", conv(builder, weights, prefix + "conv2", 1, 1));
      block.register_module("bn2", batch_norm(builder, weights, prefix + "bn2"));
      if (b.downsample()) {
        block.register_module(
            "downsample",
            sequential(builder, "Downsample",
                       {conv(builder, weights, prefix + "downsample.0", b.stride, 0),
                        batch_norm(builder, weights, prefix + "downsample.1")}));
      }
      builder.define(block, replace_all(kBasicBlockSource, "{SHORTCUT}",
                                        b.downsample() ? "self.downsample.forward(x)" : "x"));
      blocks.push_back(block);
    }
    // Stages differ in their number of blocks: a kind each.
    const std::string layer = "layer" + std::to_string(s + 1);
    resnet.register_module(layer, sequential(builder, "Layer" + std::to_string(s + 1), blocks));
    trunk += "    x = self." + layer + ".forward(x)\n";
  }
  resnet.register_module("fc", linear(builder, weights, "fc"));
  trunk += "    features = x.mean([2, 3])\n    logits = self.fc.forward(features)\n";
  finish_model(builder, resnet, weights, "ResNet", trunk);
  return resnet;
}

void write_atomically(const torch::jit::Module& module, const std::string& path) {
  std::ostringstream bytes;
  try {
    module.save(bytes);
  } catch (const std::exception& e) {
    throw Error(path + ": cannot write (" + first_line(message_of(e)) + ")");
  }
  write_file_atomically(path, bytes.view());
}

// "Tensor[2, 5]", "Tuple[Tensor[2, 5], int]", "Dict(str, Tensor)"...: what a forward returned.
std::string describe(const c10::IValue& value) {
  if (value.isTensor()) {
    const torch::Tensor& tensor = value.toTensor();
    if (!tensor.defined()) return "an undefined Tensor";
    std::ostringstream out;
    out << "Tensor" << tensor.sizes();
    if (!tensor.is_floating_point()) out << " of " << tensor.scalar_type();
    return out.str();
  }
  const auto describe_items = [](const char* name, const auto& items) {
    std::string out = std::string(name) + "[";
    for (std::size_t i = 0; i < items.size(); ++i) {
      out += (i ? ", " : "") + describe(items[i]);
    }
    return out + "]";
  };
  if (value.isTuple()) return describe_items("Tuple", value.toTupleRef().elements());
  if (value.isList()) return describe_items("List", value.toListRef());
  if (value.isNone()) return "None";
  return value.type()->annotation_str();
}

bool batch_of(const c10::IValue& value, std::int64_t batch, std::int64_t dims) {
  if (!value.isTensor()) return false;
  const torch::Tensor& tensor = value.toTensor();
  return tensor.defined() && tensor.is_floating_point() && tensor.dim() == dims &&
         tensor.size(0) == batch;
}

}  // namespace

void export_torchscript(const ImageModel& model, const std::string& path) {
  if (model->config().is_script()) {
    torch::jit::Module& module = scripted_module(model);
    const bool training = module.is_training();
    module.eval();
    try {
      write_atomically(module, path);
    } catch (...) {
      module.train(training);
      throw;
    }
    module.train(training);
    return;
  }
  torch::jit::Module module;
  try {
    module = model->config().is_vit() ? build_vit(model) : build_resnet(model);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    // A bug of ours (TorchScript source that does not compile), not a user error; say where.
    throw Error(path + ": cannot build the TorchScript module (" + short_reason(e) + ")");
  }
  write_atomically(module, path);
}

struct ScriptedModel::Impl {
  std::string path;
  torch::jit::Module module;
  std::string code_fingerprint;
};

namespace {

// FNV-1a over each code/*.py entry's name (below the archive's folder, which follows the file
// name it was saved as) and CRC-32; debug info (*.debug_pkl) names the source files it came from.
std::string fingerprint_code(std::span<const std::uint8_t> archive) {
  std::string problem;
  std::uint64_t hash = 14695981039346656037ull;
  const auto mix = [&hash](const void* data, std::size_t size) {
    for (std::size_t i = 0; i < size; ++i) {
      hash = (hash ^ static_cast<const std::uint8_t*>(data)[i]) * 1099511628211ull;
    }
  };
  for (const ZipEntry& entry : zip_entries(archive, problem)) {
    const std::string_view name = entry.name.substr(entry.name.find('/') + 1);
    if (name.rfind("code/", 0) != 0 || !name.ends_with(".py")) continue;
    mix(name.data(), name.size());
    mix(&entry.crc, sizeof entry.crc);
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hash));
  return hex;
}

}  // namespace

ScriptedModel::ScriptedModel(const std::string& path, torch::Device device)
    : impl_(std::make_unique<Impl>()) {
  impl_->path = path;
  std::error_code error;
  const auto status = std::filesystem::status(path, error);
  if (!std::filesystem::exists(status)) throw Error(path + ": no such file");
  if (std::filesystem::is_directory(status)) {
    throw Error(path + ": is a folder, not a TorchScript model");
  }
  const MappedFile file = read_checked_archive(path, "model file");
  const std::span<const std::uint8_t> bytes = file.bytes();
  // A checkpoint is a LibTorch archive too: it loads, but has no forward.
  const auto checkpoint_hint = [&path] {
    return Error(path + ": a flowtrain checkpoint, not a TorchScript model: make one with "
                 "`flowtrain export " + path + " --out MODEL.pt`");
  };
  try {
    impl_->module = torch::jit::load(std::make_shared<BytesReader>(bytes), device);
  } catch (const std::exception& e) {
    if (is_checkpoint(path)) throw checkpoint_hint();
    throw Error(path + ": not a TorchScript model (" + short_reason(e) + ")");
  }
  if (!impl_->module.find_method("forward")) {
    if (is_checkpoint(path)) throw checkpoint_hint();
    throw Error(path + ": the module has no forward method");
  }
  impl_->module.eval();
  impl_->code_fingerprint = fingerprint_code(bytes);
}

ScriptedModel::~ScriptedModel() = default;
ScriptedModel::ScriptedModel(ScriptedModel&&) noexcept = default;
ScriptedModel& ScriptedModel::operator=(ScriptedModel&&) noexcept = default;

const std::string& ScriptedModel::path() const { return impl_->path; }

const std::string& ScriptedModel::code_fingerprint() const { return impl_->code_fingerprint; }

std::optional<int> ScriptedModel::image_size() const {
  if (!impl_->module.hasattr("image_size")) return std::nullopt;
  const c10::IValue value = impl_->module.attr("image_size");
  if (!value.isInt()) return std::nullopt;
  return static_cast<int>(value.toInt());
}

void ScriptedModel::cast_parameters(
    const std::function<bool(const std::string&, const std::string&)>& select,
    torch::ScalarType dtype) {
  for (const torch::jit::Module& module : impl_->module.modules()) {
    const std::string class_name = module.type()->name()->qualifiedName();
    for (const auto& p : module.named_parameters(/*recurse=*/false)) {
      if (select(class_name, p.name)) p.value.set_data(p.value.to(dtype));
    }
  }
}

torch::jit::Module& ScriptedModel::module() { return impl_->module; }

ModelOutput ScriptedModel::forward(const torch::Tensor& images) const {
  torch::NoGradGuard no_grad;
  return forward_with_grad(images);
}

ModelOutput ScriptedModel::forward_with_grad(const torch::Tensor& images) const {
  c10::IValue result;
  try {
    // Module is a handle: a copy shares the module, and forward only reads its state.
    torch::jit::Module module = impl_->module;
    result = module.forward({images});
  } catch (const std::exception& e) {
    throw Error(impl_->path + ": forward failed: " + short_reason(e));
  }
  const std::int64_t batch = images.dim() > 0 ? images.size(0) : -1;
  ModelOutput out;
  if (batch_of(result, batch, 2)) {
    out.logits = result.toTensor();
    return out;
  }
  if (result.isTuple() || result.isList()) {
    const std::vector<c10::IValue> items =
        result.isTuple() ? result.toTupleRef().elements().vec() : result.toListRef().vec();
    if (items.size() == 2 && batch_of(items[0], batch, 2) &&
        (batch_of(items[1], batch, 2) || batch_of(items[1], batch, 1))) {
      out.logits = items[0].toTensor();
      out.regression = items[1].toTensor();
      if (out.regression.dim() == 1) out.regression = out.regression.unsqueeze(1);
      return out;
    }
  }
  if (result.isGenericDict()) {
    const auto regression_ok = [&](const c10::IValue& v) {
      return batch_of(v, batch, 2) || batch_of(v, batch, 1);
    };
    for (const auto& item : result.toGenericDict()) {
      const std::string key = item.key().isString() ? item.key().toStringRef() : "";
      const c10::IValue& value = item.value();
      if (key == "logits" && batch_of(value, batch, 2)) {
        out.logits = value.toTensor();
      } else if (key == "distillation" && batch_of(value, batch, 2)) {
        out.distillation = value.toTensor();
      } else if (key == "regression" && regression_ok(value)) {
        out.regression = value.toTensor();
        if (out.regression.dim() == 1) out.regression = out.regression.unsqueeze(1);
      } else {
        throw Error(impl_->path + ": forward returned a dict whose '" + key + "' is " +
                    describe(value) + ", expected 'logits' [B, classes] and optionally " +
                    "'distillation' [B, classes] and 'regression' [B, outputs]");
      }
    }
    if (out.logits.defined()) return out;
  }
  throw Error(impl_->path + ": forward returned " + describe(result) +
              ", expected a Tensor of logits [B, classes], a tuple (logits, regression) or a "
              "dict with 'logits' (and optionally 'distillation', 'regression')");
}

}  // namespace flowtrain::train
