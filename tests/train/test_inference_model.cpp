#include <doctest/doctest.h>
#include <torch/torch.h>

#include <memory>
#include <string>

#include "../temp_dir.hpp"
#include "stages/train/checkpoint.hpp"
#include "stages/train/compute.hpp"
#include "stages/train/inference_model.hpp"
#include "stages/train/torchscript.hpp"
#include "stages/train/vit.hpp"

using namespace flowtrain::train;
using Precision = InferenceModel::Precision;

namespace {

ViTConfig teacher_config() {
  return {.image_size = 32,
          .patch_size = 8,
          .dim = 64,
          .depth = 2,
          .heads = 4,
          .classes = 10,
          .regression_outputs = 1};
}

// ||a - b|| / ||b||.
double relative_error(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).norm().item<double>() / b.norm().item<double>();
}

}  // namespace

TEST_CASE("Train.InferenceModel.Bf16TeacherCastsWeightsOnceAndStaysNearFloat32" *
          doctest::timeout(120)) {
  flowtrain::testing::TempDir dir("inference-model");
  torch::manual_seed(3);
  ViT model(teacher_config());
  model->eval();
  {  // like a trained model: no zero biases
    torch::NoGradGuard no_grad;
    for (torch::Tensor& p : model->parameters()) p.add_(torch::randn_like(p), 0.1);
  }
  const std::string checkpoint = dir.str("teacher.pt");
  save_checkpoint(checkpoint, model, nullptr, {});
  const std::string scripted = dir.str("teacher-script.pt");
  export_torchscript(model, scripted);
  const torch::Tensor images = torch::randn({8, 3, 32, 32});

  for (const std::string& path : {checkpoint, scripted}) {
    CAPTURE(path);
    const std::unique_ptr<InferenceModel> fp32 = InferenceModel::load(path);
    const std::unique_ptr<InferenceModel> bf16 = InferenceModel::load(path, Precision::kBFloat16);
    CHECK(bf16->description().find("bf16") != std::string::npos);
    const ViTOutput exact = fp32->forward(images);
    ViTOutput autocast;  // what teacher_infer computed before: float32 weights under autocast
    {
      Autocast scope(true);
      autocast = fp32->forward(images);
    }
    const ViTOutput out = bf16->forward(images);

    // float32 out, whatever the model computes in.
    CHECK((out.logits.scalar_type() == torch::kFloat));
    CHECK((out.regression.scalar_type() == torch::kFloat));
    if (path == checkpoint) {
      // The same bits as the ViT under autocast, which casts the weights on every call.
      CHECK(torch::equal(out.logits, autocast.logits.to(torch::kFloat)));
      CHECK(torch::equal(out.regression, autocast.regression.to(torch::kFloat)));
    }
    // bf16 did run (the logits moved), within bf16's rounding of the float32 teacher.
    CHECK_FALSE(torch::equal(out.logits, exact.logits));
    CHECK(relative_error(out.logits, exact.logits) < 0.03);
    CHECK(relative_error(out.regression, exact.regression) < 0.03);
    // Its input and the float32 model are left as they were.
    CHECK(torch::equal(fp32->forward(images).logits, exact.logits));
  }
}
