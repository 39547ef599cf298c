#pragma once

// Weights in and out of flowtrain in PyTorch's own files: a state_dict as torch.save writes it
// (a zip of a pickle and raw storages) and safetensors. Names follow our models' (timm's for the
// ViT, torchvision's for the ResNet); torchvision's VisionTransformer names are mapped.

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "stages/train/models/model.hpp"

namespace flowtrain::train {

/// Named tensors in order: what `torch.save(model.state_dict(), f)` holds.
using StateDict = std::vector<std::pair<std::string, torch::Tensor>>;

/// A weights file's format: torch.save's zip ("state_dict", read by torch.load) or safetensors.
enum class WeightsFormat { kStateDict, kSafetensors };

/// The names a state_dict is written with. kFlowtrain: every parameter and buffer under the
/// model's own names (timm's for the ViT, torchvision's resnet18/34 for the ResNet, plus
/// `regression_head.*`). kTorchvision: the names of torchvision 0.14's VisionTransformer
/// (conv_proj, class_token, encoder.pos_embedding, encoder.layers.encoder_layer_<i>.{ln_1,
/// self_attention.in_proj_*, self_attention.out_proj, ln_2, mlp.0, mlp.3}, encoder.ln,
/// heads.head) or ResNet (the same as ours).
enum class WeightsLayout { kFlowtrain, kTorchvision };

/// Reads a weights file, telling the kind by its content: safetensors, a torch.save zip of a
/// dict of tensors (an OrderedDict from state_dict(), or a plain dict), or a flowtrain
/// checkpoint (its model weights; the averaged ones if it has them). Throws flowtrain::Error,
/// one line naming `path` and the reason (missing, damaged, not a dict of tensors, an
/// unsupported dtype, torch.save's legacy non-zip format).
///
///   StateDict weights = read_weights("resnet18.pth");
StateDict read_weights(const std::string& path);

/// The tensors of a safetensors file's bytes (`path` names it in errors). Every size and offset
/// is checked against the bytes before it is used: a damaged file is an Error, never a crash.
StateDict parse_safetensors(std::span<const std::uint8_t> bytes, const std::string& path);

/// `weights` as the bytes of a file of `format`: torch.load reads a kStateDict file as a dict of
/// tensors (LibTorch's pickle_save), and a kSafetensors file holds them little-endian, in order,
/// after a JSON header padded to 8 bytes.
std::string weights_bytes(const StateDict& weights, WeightsFormat format);

/// weights_bytes written with write_file_atomically.
///
///   write_weights("student.safetensors", model_weights(*model), WeightsFormat::kSafetensors);
void write_weights(const std::string& path, const StateDict& weights, WeightsFormat format);

/// CPU copies of `model`'s parameters and buffers (module by module, each module's parameters
/// then its buffers: the order of PyTorch's state_dict()), under
/// `layout`'s names. Any module takes kFlowtrain; kTorchvision needs our ViT or ResNet, and
/// throws Error naming what torchvision's model has no place for (a regression head, DeiT's
/// distillation token).
StateDict model_weights(const torch::nn::Module& model,
                        WeightsLayout layout = WeightsLayout::kFlowtrain);

/// Where `init` weights come from, and which of the model's tensors keep their initial values.
struct WeightsInit {
  std::string path;
  /// Name prefixes (whole dotted components: "head" covers head.weight, not head_dist.weight)
  /// of tensors left as initialised, e.g. a classifier head for other classes. Matched against
  /// both the model's names and the file's.
  std::vector<std::string> skip = {};
};

/// What init_weights did.
struct InitCounts {
  std::size_t loaded = 0;   // the model's tensors set from the file
  std::size_t skipped = 0;  // the model's tensors under a skip prefix, left as initialised
  std::string layout;       // "flowtrain" or "torchvision": the names the file had
};

/// Sets `model`'s parameters and buffers from the file `init.path` (read_weights). A key
/// prefix "module." on every key (DistributedDataParallel's) is dropped, and torchvision's
/// VisionTransformer names are mapped to ours. Every tensor of the model but the skipped must
/// be in the file with its shape, and every tensor of the file must be the model's (or
/// skipped); otherwise Error, one line naming the file and the first missing, unexpected or
/// wrong-shaped key (with both shapes). Values are copied (floating point into floating point,
/// converted to the model's dtype); the model is left untouched on an error.
///
///   InitCounts counts = init_weights(*model, {.path = "resnet18.pth", .skip = {"fc"}});
InitCounts init_weights(torch::nn::Module& model, const WeightsInit& init);

/// "head, head_dist" -> {"head", "head_dist"}: the `init_skip` param's prefixes.
std::vector<std::string> skip_prefixes(const std::string& list);

}  // namespace flowtrain::train
