#include "stages/train/files/weights.hpp"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/torch.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>


#include "graph/atomic_file.hpp"
#include "graph/error.hpp"
#include "graph/read_file.hpp"
#include "stages/train/files/checkpoint.hpp"
#include "stages/train/files/torch_error.hpp"
#include "stages/train/files/weight_files.hpp"
#include "stages/train/files/zip_check.hpp"
#include "stages/train/models/resnet.hpp"
#include "stages/train/models/vit.hpp"

namespace flowtrain::train {

// Both formats store tensors little-endian; we copy their bytes as they are.
static_assert(std::endian::native == std::endian::little, "weights files are little-endian");

std::string shape_text(c10::IntArrayRef sizes) {
  std::string out = "[";
  for (std::size_t i = 0; i < sizes.size(); ++i) out += (i ? ", " : "") + std::to_string(sizes[i]);
  return out + "]";
}

// A tensor of `dtype` and `shape` holding `bytes` (which must be exactly its size), copied into
// memory of its own (the file's bytes need not be aligned for the dtype).
torch::Tensor tensor_from_bytes(const std::uint8_t* bytes,
                                std::size_t size,
                                torch::ScalarType dtype,
                                const std::vector<std::int64_t>& shape) {
  torch::Tensor tensor = torch::empty(shape, torch::TensorOptions().dtype(dtype));
  if (size > 0) std::memcpy(tensor.data_ptr(), bytes, size);
  return tensor;
}

namespace {

// ---------------------------------------------------------------------------------------------
// torchvision's VisionTransformer names <-> ours (timm's). Prefixes end in '.'; the others are
// whole names.

constexpr std::pair<const char*, const char*> kVitTopNames[] = {
    {"patch_embed.proj.", "conv_proj."}, {"cls_token", "class_token"},
    {"pos_embed", "encoder.pos_embedding"}, {"norm.", "encoder.ln."},
    {"head.", "heads.head."},
};
constexpr std::pair<const char*, const char*> kVitBlockNames[] = {
    {"norm1.", "ln_1."},
    {"attn.qkv.weight", "self_attention.in_proj_weight"},
    {"attn.qkv.bias", "self_attention.in_proj_bias"},
    {"attn.proj.", "self_attention.out_proj."},
    {"norm2.", "ln_2."},
    {"mlp.fc1.", "mlp.0."},
    {"mlp.fc2.", "mlp.3."},
};
// torchvision before 0.13 named the MLP's layers so (0.14 still loads them).
constexpr std::pair<const char*, const char*> kVitOldBlockNames[] = {
    {"mlp.fc1.", "mlp.linear_1."},
    {"mlp.fc2.", "mlp.linear_2."},
};
constexpr const char* kOurBlock = "blocks.";
constexpr const char* kTorchvisionBlock = "encoder.layers.encoder_layer_";

bool starts_with(const std::string& s, std::string_view prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

// `name` renamed by the first pair whose `from` side matches it (a prefix ending in '.', or the
// whole name), or nullopt.
template <std::size_t N>
std::optional<std::string> rename(const std::string& name,
                                  const std::pair<const char*, const char*> (&pairs)[N],
                                  bool forward) {
  for (const auto& pair : pairs) {
    const std::string from = forward ? pair.first : pair.second;
    const std::string to = forward ? pair.second : pair.first;
    if (from.back() == '.' ? starts_with(name, from) : name == from) {
      return to + name.substr(from.size());
    }
  }
  return std::nullopt;
}

// A block's name "<block prefix><i>.<rest>" as (i, rest).
std::optional<std::pair<std::string, std::string>> block_part(const std::string& name,
                                                              const char* prefix) {
  if (!starts_with(name, prefix)) return std::nullopt;
  const std::size_t begin = std::strlen(prefix);
  const std::size_t dot = name.find('.', begin);
  if (dot == std::string::npos || dot == begin) return std::nullopt;
  const std::string index = name.substr(begin, dot - begin);
  if (!std::all_of(index.begin(), index.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  return std::make_pair(index, name.substr(dot + 1));
}

std::optional<std::string> vit_to_torchvision(const std::string& ours) {
  if (const auto block = block_part(ours, kOurBlock)) {
    const auto rest = rename(block->second, kVitBlockNames, true);
    if (!rest) return std::nullopt;
    return kTorchvisionBlock + block->first + "." + *rest;
  }
  return rename(ours, kVitTopNames, true);
}

std::optional<std::string> vit_from_torchvision(const std::string& theirs) {
  if (const auto block = block_part(theirs, kTorchvisionBlock)) {
    auto rest = rename(block->second, kVitBlockNames, false);
    if (!rest) rest = rename(block->second, kVitOldBlockNames, false);
    if (!rest) return std::nullopt;
    return kOurBlock + block->first + "." + *rest;
  }
  return rename(theirs, kVitTopNames, false);
}

bool is_torchvision_vit(const StateDict& weights) {
  return std::any_of(weights.begin(), weights.end(), [](const auto& item) {
    return item.first == "class_token" || starts_with(item.first, "conv_proj.") ||
           starts_with(item.first, kTorchvisionBlock);
  });
}

// Whether `name` is `prefix` or lies under it ("head" covers "head.weight", not "head_dist.w").
bool under(const std::string& name, const std::string& prefix) {
  return name == prefix || (starts_with(name, prefix) && name[prefix.size()] == '.') ||
         (!prefix.empty() && prefix.back() == '.' && starts_with(name, prefix));
}

bool skipped(const std::vector<std::string>& skip, const std::string& name) {
  return std::any_of(skip.begin(), skip.end(),
                     [&](const std::string& prefix) { return under(name, prefix); });
}

// The model's parameters and buffers in the order PyTorch's state_dict() lists them: module by
// module, depth first, each module's own parameters then its buffers.
StateDict named_tensors(const torch::nn::Module& model) {
  StateDict out;
  for (const auto& module : model.named_modules("", /*include_self=*/true)) {
    const std::string prefix = module.key().empty() ? "" : module.key() + ".";
    for (const auto& item : module.value()->named_parameters(/*recurse=*/false)) {
      out.emplace_back(prefix + item.key(), item.value());
    }
    for (const auto& item : module.value()->named_buffers(/*recurse=*/false)) {
      out.emplace_back(prefix + item.key(), item.value());
    }
  }
  return out;
}

}  // namespace

StateDict read_weights(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) throw Error(path + ": no such weights file");
  // Mapped, not read: a reader touches the parts it checks first, and what it reads of a
  // large entry it gives back (a file claiming gigabytes it does not hold costs no memory).
  const MappedFile file(path);
  const std::span<const std::uint8_t> bytes = file.bytes();
  // By its name, a damaged safetensors file still gets the reason it is damaged. (Before the
  // zip check: raw tensor data may hold a zip directory's signature by chance.)
  const bool named_safetensors =
      path.size() >= 12 && path.compare(path.size() - 12, 12, ".safetensors") == 0;
  if (named_safetensors || looks_like_safetensors(bytes)) return parse_safetensors(bytes, path);
  const bool zip = bytes.size() >= 4 && std::memcmp(bytes.data(), "PK\x03\x04", 4) == 0;
  if (!zip) {
    if (bytes.size() >= 2 && bytes[0] == 0x80 && bytes[1] <= 5) {
      throw Error(path + ": torch.save's legacy format (_use_new_zipfile_serialization=False): "
                         "load it and save it again with torch.save's default");
    }
    throw Error(path + ": not a weights file (neither safetensors nor a torch.save zip)");
  }
  std::string problem;
  const std::vector<ZipEntry> entries = zip_entries(bytes, problem);
  if (!problem.empty()) throw Error(path + ": damaged weights file (" + problem + ")");
  // A TorchScript archive (a flowtrain checkpoint, or a module), not a torch.save file.
  if (find_entry(entries, "constants.pkl")) {
    if (std::optional<Checkpoint> checkpoint = try_read_checkpoint(path)) {
      return model_weights(*load_model(*checkpoint));
    }
    throw Error(path + ": a TorchScript module, not a state_dict (save model.state_dict() with "
                       "torch.save)");
  }
  return read_torch_save(entries, path,
                         [&file](std::span<const std::uint8_t> part) { file.release(part); });
}

std::string weights_bytes(const StateDict& weights, WeightsFormat format) {
  if (format == WeightsFormat::kSafetensors) return safetensors_bytes(weights);
  c10::Dict<std::string, torch::Tensor> dict;
  for (const auto& [name, tensor] : weights) {
    dict.insert(name, tensor.detach().to(torch::kCPU).contiguous());
  }
  const std::vector<char> bytes = torch::jit::pickle_save(c10::IValue(dict));
  return std::string(bytes.begin(), bytes.end());
}

void write_weights(const std::string& path, const StateDict& weights, WeightsFormat format) {
  write_file_atomically(path, weights_bytes(weights, format));
}

StateDict model_weights(const torch::nn::Module& model, WeightsLayout layout) {
  StateDict out;
  torch::NoGradGuard no_grad;
  const bool vit = dynamic_cast<const ViTImpl*>(&model) != nullptr;
  const bool resnet = dynamic_cast<const ResNetImpl*>(&model) != nullptr;
  if (layout == WeightsLayout::kTorchvision && !vit && !resnet) {
    throw Error("layout torchvision: the model is neither our ViT nor our ResNet (use the "
                "default layout)");
  }
  for (const auto& [name, tensor] : named_tensors(model)) {
    std::string out_name = name;
    if (layout == WeightsLayout::kTorchvision) {
      std::optional<std::string> mapped = vit ? vit_to_torchvision(name) : std::optional(name);
      if (starts_with(name, "regression_head.")) mapped.reset();
      if (!mapped) {
        throw Error("layout torchvision: torchvision's " +
                    std::string(vit ? "VisionTransformer" : "ResNet") + " has no place for '" +
                    name + "' (" +
                    (starts_with(name, "regression_head.") ? "a regression head"
                     : name == "dist_token" || starts_with(name, "head_dist.")
                         ? "DeiT's distillation token"
                         : "a tensor of ours") +
                    "): export it with the default layout");
      }
      out_name = *mapped;
    }
    out.emplace_back(out_name, tensor.detach().to(torch::kCPU).contiguous().clone());
  }
  return out;
}

std::vector<std::string> skip_prefixes(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');) {
    const std::size_t begin = item.find_first_not_of(" \t");
    if (begin == std::string::npos) continue;
    out.push_back(item.substr(begin, item.find_last_not_of(" \t") - begin + 1));
  }
  return out;
}

InitCounts init_weights(torch::nn::Module& model, const WeightsInit& init) {
  const std::string& path = init.path;
  StateDict file = read_weights(path);
  // DistributedDataParallel's wrapper prefixes every name with "module.".
  if (!file.empty() && std::all_of(file.begin(), file.end(), [](const auto& item) {
        return starts_with(item.first, "module.");
      })) {
    for (auto& item : file) item.first.erase(0, 7);
  }
  InitCounts counts;
  counts.layout = "flowtrain";
  const StateDict ours = named_tensors(model);
  const bool model_is_vit = dynamic_cast<const ViTImpl*>(&model) != nullptr;
  // The file's tensors by the model's names, each with its name in the file (for errors).
  std::map<std::string, std::pair<std::string, torch::Tensor>> by_our_name;
  const bool torchvision = model_is_vit && is_torchvision_vit(file);
  if (torchvision) counts.layout = "torchvision";
  for (auto& [name, tensor] : file) {
    std::optional<std::string> our_name = torchvision ? vit_from_torchvision(name) : name;
    if (!our_name) continue;  // unexpected, said below
    by_our_name.emplace(*our_name, std::make_pair(name, tensor));
  }
  std::vector<std::pair<torch::Tensor, torch::Tensor>> copies;  // (model's, file's)
  std::set<std::string> used;
  for (const auto& [name, target] : ours) {
    const auto found = by_our_name.find(name);
    const std::string file_name =
        found != by_our_name.end()
            ? found->second.first
            : (torchvision ? vit_to_torchvision(name).value_or(name) : name);
    if (skipped(init.skip, name) || skipped(init.skip, file_name)) {
      ++counts.skipped;
      if (found != by_our_name.end()) used.insert(name);
      continue;
    }
    if (found == by_our_name.end()) {
      throw Error(path + ": missing key '" + file_name + "' " + shape_text(target.sizes()) +
                  " (the model has it, the file does not; init_skip leaves it as initialised)");
    }
    const torch::Tensor& value = found->second.second;
    if (value.sizes() != target.sizes()) {
      throw Error(path + ": key '" + file_name + "' is " + shape_text(value.sizes()) +
                  " in the file but " + shape_text(target.sizes()) +
                  " in the model (init_skip leaves it as initialised)");
    }
    if (value.is_floating_point() != target.is_floating_point()) {
      throw Error(path + ": key '" + file_name + "' is " +
                  std::string(c10::toString(value.scalar_type())) + " in the file but " +
                  std::string(c10::toString(target.scalar_type())) + " in the model");
    }
    copies.emplace_back(target, value);
    used.insert(name);
  }
  for (const auto& [name, tensor] : file) {
    const std::optional<std::string> our_name = torchvision ? vit_from_torchvision(name) : name;
    const bool is_used = our_name && used.count(*our_name);
    if (is_used || skipped(init.skip, name) || (our_name && skipped(init.skip, *our_name))) {
      continue;
    }
    throw Error(path + ": unexpected key '" + name + "' " + shape_text(tensor.sizes()) +
                " (the model has no such tensor; init_skip ignores it)");
  }
  torch::NoGradGuard no_grad;
  for (auto& [target, value] : copies) target.copy_(value);
  counts.loaded = copies.size();
  return counts;
}

}  // namespace flowtrain::train
