#include "stages/train/inference/inference_model.hpp"

#include <torch/torch.h>

#include <filesystem>
#include <utility>

#include "graph/error.hpp"
#include "stages/train/files/checkpoint.hpp"
#include "stages/train/files/torchscript.hpp"
#include "stages/train/files/weights.hpp"
#include "stages/train/models/compute.hpp"
#include "stages/train/partitioned/batch_runner.hpp"

namespace flowtrain::train {

namespace {

// The dtype a model of `precision` autocasts to (float32: none).
c10::ScalarType autocast_of(InferenceModel::Precision precision) {
  switch (precision) {
    case InferenceModel::Precision::kBFloat16: return c10::kBFloat16;
    case InferenceModel::Precision::kFloat16: return c10::kHalf;
    case InferenceModel::Precision::kFloat32: break;
  }
  return c10::kFloat;
}

// Runs `forward` on `device` without gradients and returns float32 outputs there; under
// autocast to `low` unless it is float32.
template <class Forward>
ModelOutput run_frozen(const torch::Tensor& images,
                       c10::ScalarType low,
                       const c10::Device& device,
                       Forward&& forward) {
  // NoGradGuard rather than InferenceMode: the outputs feed the student's loss, and autograd
  // refuses to save inference-mode tensors for backward.
  torch::NoGradGuard no_grad;
  ModelOutput out;
  {
    Autocast autocast(low, device.type());
    out = forward(images.to(device, /*non_blocking=*/true));
  }
  if (out.logits.defined()) out.logits = out.logits.to(torch::kFloat);
  if (out.regression.defined()) out.regression = out.regression.to(torch::kFloat);
  return out;
}

// Whether a parameter is one autocast uses in bf16, which a bf16 model holds in bf16: the
// weight and bias of a Linear layer (the built-in ViT casts linear biases too, see vit.cpp) and
// the weight of a convolution (autocast leaves its bias float32). By the module's class name,
// which TorchScript keeps ("__torch__.torch.nn.modules.linear.Linear").
const char* precision_suffix(c10::ScalarType low) {
  return low == c10::kBFloat16 ? ", bf16" : low == c10::kHalf ? ", fp16" : "";
}

bool held_in_bf16(const std::string& class_name, const std::string& parameter) {
  const std::string name = class_name.substr(class_name.rfind('.') + 1);
  if (name == "Linear") return parameter == "weight" || parameter == "bias";
  return name.rfind("Conv", 0) == 0 && parameter == "weight";
}

class CheckpointModel final : public InferenceModel {
 public:
  CheckpointModel(const Checkpoint& checkpoint,
                  Precision precision,
                  const std::string& init,
                  const c10::Device& device)
      : model_(load_model(checkpoint)), low_(autocast_of(precision)), device_(device) {
    if (!init.empty()) {
      try {
        init_weights(*model_, {.path = init});
      } catch (const Error& e) {
        throw Error(std::string("param 'init': ") + e.what());
      }
    }
    if (device_.is_cuda()) model_->to(device_);
    if (low_ == c10::kFloat) return;
    for (const std::shared_ptr<torch::nn::Module>& module : model_->modules()) {
      const char* class_name = module->as<torch::nn::Linear>()   ? "Linear"
                               : module->as<torch::nn::Conv2d>() ? "Conv2d"
                                                                 : "";
      for (auto& parameter : module->named_parameters(/*recurse=*/false)) {
        torch::Tensor& p = parameter.value();
        if (held_in_bf16(class_name, parameter.key())) p.set_data(p.to(low_));
      }
    }
  }

  ModelOutput forward(const torch::Tensor& images) override {
    return run_frozen(images, low_, device_,
                      [this](const torch::Tensor& x) { return model_->forward(x); });
  }

  std::string description() const override {
    char buf[64];
    std::snprintf(buf, sizeof buf, ", %.2fM parameters%s",
                  static_cast<double>(parameter_count(*model_)) / 1e6, precision_suffix(low_));
    return model_->config().describe() + buf;
  }

  const ModelConfig* config() const override { return &model_->config(); }

  int blocks() const override { return model_->blocks(); }

  PartitionOutput forward_partition(const torch::Tensor& input, int begin, int end) override {
    const int blocks = model_->blocks();
    if (begin < 0 || begin >= end || end > blocks) {
      throw Error("a pipeline partition of blocks [" + std::to_string(begin) + ", " +
                  std::to_string(end) + ") of a model of " + std::to_string(blocks) + " blocks");
    }
    PartitionOutput out;
    // The activation is handed on as the blocks made it (no cast: the next blocks see it so).
    out.outputs = run_frozen(input, low_, device_, [&](const torch::Tensor& x) {
      out.activation = model_->run_blocks(begin == 0 ? model_->embed(x) : x, begin, end);
      return end == blocks ? model_->head(std::exchange(out.activation, torch::Tensor()))
                           : ModelOutput{};
    });
    return out;
  }

  void keep_only(int begin, int end) override {
    const int blocks = model_->blocks();
    const auto kept = [&](const std::string& name) {
      const int piece = model_->piece_of(name);
      if (piece == 0) return begin == 0;
      if (piece == blocks + 1) return end == blocks;
      return piece - 1 >= begin && piece - 1 < end;
    };
    const auto release = [&](const auto& named) {
      for (const auto& item : named) {
        if (!kept(item.key())) item.value().set_data(torch::empty({0}, item.value().options()));
      }
    };
    release(model_->named_parameters());
    release(model_->named_buffers());
  }

  std::vector<double> piece_seconds(const torch::Tensor& images) override {
    torch::NoGradGuard no_grad;
    Autocast autocast(low_, device_.type());
    return train::piece_seconds(*model_, images.to(device_), /*backward=*/false);
  }

  std::int64_t weight_bytes() const override {
    std::int64_t bytes = 0;
    for (const torch::Tensor& t : model_->parameters())
      bytes += static_cast<std::int64_t>(t.nbytes());
    for (const torch::Tensor& t : model_->buffers()) bytes += static_cast<std::int64_t>(t.nbytes());
    return bytes;
  }

 private:
  ImageModel model_;
  c10::ScalarType low_;
  c10::Device device_;
};

class TorchScriptModel final : public InferenceModel {
 public:
  TorchScriptModel(const std::string& path, Precision precision, const c10::Device& device)
      : model_(path), low_(autocast_of(precision)), device_(device) {
    if (device_.is_cuda()) model_.module().to(device_);
    if (low_ != c10::kFloat) model_.cast_parameters(held_in_bf16, low_);
  }

  ModelOutput forward(const torch::Tensor& images) override {
    try {
      return run_frozen(images, low_, device_,
                        [this](const torch::Tensor& x) { return model_.forward(x); });
    } catch (const Error& e) {
      // PyTorch 1.13's fused ops (nn.MultiheadAttention's fast path among them) take no mix of
      // bf16 inputs and float32 weights, and autocast does not cover them.
      const std::string what = e.what();
      const std::size_t dtype = what.find("expected scalar type");
      if (low_ != c10::kBFloat16 || dtype == std::string::npos) throw;
      throw Error(model_.path() + ": fails under autocast: bf16 (" +
                  what.substr(dtype, what.find_first_of(")\n", dtype) - dtype) +
                  ": an op PyTorch 1.13 runs fused, such as nn.MultiheadAttention's fast path, "
                  "takes no bf16 here); set autocast: none for this stage");
    }
  }

  std::string description() const override {
    return std::string("TorchScript module") + precision_suffix(low_);
  }

 private:
  ScriptedModel model_;
  c10::ScalarType low_;
  c10::Device device_;
};

}  // namespace

InferenceModel::PartitionOutput InferenceModel::forward_partition(const torch::Tensor&, int, int) {
  throw Error(description() +
              " cannot be split into pipeline partitions (a flowtrain "
              "checkpoint can)");
}

std::vector<double> InferenceModel::piece_seconds(const torch::Tensor& images) {
  forward_partition(images, 0, 1);  // throws Error: this model cannot be split
  return {};
}

std::unique_ptr<InferenceModel> InferenceModel::load(const std::string& path,
                                                     Precision precision,
                                                     const std::string& init,
                                                     const c10::Device& device) {
  check_autocast(autocast_of(precision), device);
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw Error(path + ": no such model file (train or export one first)");
  }
  if (const std::optional<Checkpoint> checkpoint = try_read_checkpoint(path)) {
    return std::make_unique<CheckpointModel>(*checkpoint, precision, init, device);
  }
  if (!init.empty()) {
    throw Error("param 'init': " + path + " is a TorchScript module, which carries its own "
                "weights; init gives a flowtrain checkpoint's model other weights");
  }
  return std::make_unique<TorchScriptModel>(path, precision, device);
}

std::unique_ptr<InferenceModel> InferenceModel::load_required(const std::string& model,
                                                              Precision precision,
                                                              const std::string& init,
                                                              const c10::Device& device) {
  if (model.empty()) throw Error("param 'model' is required (a checkpoint or TorchScript file)");
  return load(model, precision, init, device);
}

}  // namespace flowtrain::train
