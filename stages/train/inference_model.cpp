#include "stages/train/inference_model.hpp"

#include <torch/torch.h>

#include <filesystem>

#include "graph/error.hpp"
#include "stages/train/checkpoint.hpp"
#include "stages/train/torchscript.hpp"

namespace flowtrain::train {

namespace {

class CheckpointModel final : public InferenceModel {
 public:
  explicit CheckpointModel(const Checkpoint& checkpoint) : model_(load_model(checkpoint)) {}

  // NoGradGuard rather than InferenceMode: the outputs feed the student's loss, and autograd
  // refuses to save inference-mode tensors for backward.
  ViTOutput forward(const torch::Tensor& images) override {
    torch::NoGradGuard no_grad;
    return model_->forward(images);
  }

  std::string description() const override {
    const ViTConfig& c = model_->config();
    char buf[160];
    std::snprintf(buf, sizeof buf, "ViT dim %d depth %d heads %d patch %d, %.2fM parameters",
                  c.dim, c.depth, c.heads, c.patch_size,
                  static_cast<double>(parameter_count(*model_)) / 1e6);
    return buf;
  }

 private:
  ViT model_;
};

class TorchScriptModel final : public InferenceModel {
 public:
  explicit TorchScriptModel(const std::string& path) : model_(path) {}

  ViTOutput forward(const torch::Tensor& images) override {
    torch::NoGradGuard no_grad;
    return model_.forward(images);
  }

  std::string description() const override { return "TorchScript module"; }

 private:
  ScriptedModel model_;
};

}  // namespace

std::unique_ptr<InferenceModel> InferenceModel::load(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw Error(path + ": no such model file (train or export one first)");
  }
  if (const std::optional<Checkpoint> checkpoint = try_read_checkpoint(path)) {
    return std::make_unique<CheckpointModel>(*checkpoint);
  }
  return std::make_unique<TorchScriptModel>(path);
}

std::unique_ptr<InferenceModel> InferenceModel::load_required(const std::string& model) {
  if (model.empty()) throw Error("param 'model' is required (a checkpoint or TorchScript file)");
  return load(model);
}

}  // namespace flowtrain::train
