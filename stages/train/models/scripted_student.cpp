#include "stages/train/models/scripted_student.hpp"

#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <sstream>

#include "graph/error.hpp"
#include "stages/train/files/torchscript.hpp"

namespace flowtrain::train {

namespace {

// Mirrors the TorchScript module `from` in `to`: the same parameters and buffers (the same
// tensors, so an update of one is an update of the other) under the same nested names, in
// PyTorch's order: a module's own parameters, its buffers, then its children's.
void mirror(const torch::jit::Module& from, torch::nn::Module& to) {
  for (const torch::jit::NameTensor& p : from.named_parameters(/*recurse=*/false)) {
    to.register_parameter(p.name, p.value, p.value.requires_grad());
  }
  for (const torch::jit::NameTensor& b : from.named_buffers(/*recurse=*/false)) {
    to.register_buffer(b.name, b.value);
  }
  for (const torch::jit::NameModule& child : from.named_children()) {
    auto holder = std::make_shared<torch::nn::Module>(child.name);
    mirror(child.value, *holder);
    to.register_module(child.name, holder);
  }
}

std::string shape_of(const torch::Tensor& t) {
  std::ostringstream out;
  out << t.sizes();
  return out.str();
}

}  // namespace

struct ScriptedStudentImpl::Impl {
  ScriptedModel scripted;
};

ScriptedStudentImpl::ScriptedStudentImpl(ModelConfig config)
    : ImageModelImpl(std::move(config)),
      impl_(std::make_unique<Impl>(Impl{ScriptedModel(config_.script)})) {
  torch::jit::Module& module = impl_->scripted.module();
  for (const torch::jit::NameTensor& p : module.named_parameters()) {
    if (p.value.scalar_type() != torch::kFloat) {
      std::ostringstream type;
      type << p.value.scalar_type();
      throw Error(config_.script + ": parameter '" + p.name + "' is " + type.str() +
                  "; a student is trained in float32 (save the module before casting it)");
    }
  }
  const std::string& code = impl_->scripted.code_fingerprint();
  if (!config_.script_code.empty() && config_.script_code != code) {
    throw Error(config_.script + ": its code is not that of the module the checkpoint trained: "
                "put the file it was trained from there");
  }
  config_.script_code = code;
  mirror(module, *this);
  train(is_training());
}

ScriptedStudentImpl::~ScriptedStudentImpl() = default;

torch::jit::Module& ScriptedStudentImpl::module() { return impl_->scripted.module(); }

void ScriptedStudentImpl::train(bool on) {
  torch::nn::Module::train(on);
  impl_->scripted.module().train(on);
}

ModelOutput ScriptedStudentImpl::forward(const torch::Tensor& images) {
  check_images(images);
  // The graph executor's optimisations off: with them the first calls of a process run the
  // profiling plan and later ones an optimised one whose gradients are computed by other means
  // (symbolic autodiff), so a resumed run, its first calls at step N, would not compute what an
  // uninterrupted run computes at step N. Unoptimised, every call runs the ops in order with
  // autograd recording them, as a model in eager PyTorch does. The setting is per thread.
  torch::jit::GraphOptimizerEnabledGuard eager(false);
  ModelOutput out = impl_->scripted.forward_with_grad(images);
  const std::int64_t batch = images.size(0);
  const std::string& path = config_.script;
  if (out.logits.size(1) != config_.classes) {
    throw Error(path + ": forward returned logits " + shape_of(out.logits) + ", expected [" +
                std::to_string(batch) + ", " + std::to_string(config_.classes) +
                "] (classes: " + std::to_string(config_.classes) + ")");
  }
  if (out.distillation.defined() && out.distillation.size(1) != config_.classes) {
    throw Error(path + ": forward returned a distillation head " + shape_of(out.distillation) +
                ", expected [" + std::to_string(batch) + ", " + std::to_string(config_.classes) +
                "]");
  }
  const std::int64_t outputs = out.regression.defined() ? out.regression.size(1) : 0;
  if (outputs != config_.regression_outputs) {
    throw Error(path + ": forward returned " +
                (out.regression.defined() ? "regression " + shape_of(out.regression)
                                          : std::string("no regression output")) +
                ", but regression_outputs is " + std::to_string(config_.regression_outputs));
  }
  if (out.regression.defined()) out.regression = scale_regression(out.regression);
  return out;
}

torch::Tensor ScriptedStudentImpl::embed(const torch::Tensor&) {
  throw Error(config_.describe() + " has no blocks to split between partitions");
}

torch::Tensor ScriptedStudentImpl::run_blocks(torch::Tensor, int, int) {
  throw Error(config_.describe() + " has no blocks to split between partitions");
}

ModelOutput ScriptedStudentImpl::head(const torch::Tensor&) {
  throw Error(config_.describe() + " has no blocks to split between partitions");
}

std::shared_ptr<ImageModelImpl> make_scripted_model(const ModelConfig& config) {
  return std::make_shared<ScriptedStudentImpl>(config);
}

torch::jit::Module& scripted_module(const ImageModel& model) {
  auto* scripted = dynamic_cast<ScriptedStudentImpl*>(model.ptr().get());
  if (!scripted) throw Error(model->config().describe() + " is not a TorchScript model");
  return scripted->module();
}

namespace {
// make_model's "torchscript" (model.hpp).
[[maybe_unused]] const bool kRegistered = register_architecture(
    "torchscript", [](const ModelConfig& config) -> std::shared_ptr<ImageModelImpl> {
      return make_scripted_model(config);
    });
}  // namespace

}  // namespace flowtrain::train
