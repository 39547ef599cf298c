#include <doctest/doctest.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <memory>
#include <string>

#include "graph/error.hpp"
#include "stages/train/files/checkpoint.hpp"
#include "stages/train/files/torchscript.hpp"
#include "stages/train/inference/inference_model.hpp"
#include "stages/train/models/compute.hpp"
#include "stages/train/models/vit.hpp"
#include "tests/temp_dir.hpp"

using namespace flowtrain::train;
using Precision = InferenceModel::Precision;

namespace {

ModelConfig teacher_config() {
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
    const ModelOutput exact = fp32->forward(images);
    ModelOutput autocast;  // what teacher_infer computed before: float32 weights under autocast
    {
      Autocast scope(c10::kBFloat16);
      autocast = fp32->forward(images);
    }
    const ModelOutput out = bf16->forward(images);

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

// A TorchScript teacher whose attention is PyTorch 1.13's fused native op (what
// nn.MultiheadAttention runs in eval mode) fails under autocast: bf16, its inputs bf16 and its
// weights float32. The error says what to do instead of a dtype message from inside the op.
TEST_CASE("Train.InferenceModel.Bf16FailureOfAFusedOpSaysToTurnAutocastOff") {
  flowtrain::testing::TempDir dir("mha");
  constexpr int kDim = 16;
  torch::jit::Module m("__torch__.FusedAttentionTeacher");
  m.register_parameter("embed_w", torch::randn({kDim, 3 * 8 * 8}) * 0.05, false);
  m.register_parameter("qkv_w", torch::randn({3 * kDim, kDim}) * 0.1, false);
  m.register_parameter("qkv_b", torch::zeros({3 * kDim}), false);
  m.register_parameter("proj_w", torch::randn({kDim, kDim}) * 0.1, false);
  m.register_parameter("proj_b", torch::zeros({kDim}), false);
  m.register_parameter("head_w", torch::randn({10, kDim}) * 0.1, false);
  m.define(R"(
    def forward(self, x):
        b = x.size(0)
        patches = x.unfold(2, 8, 8).unfold(3, 8, 8).permute(0, 2, 3, 1, 4, 5).reshape(b, -1, 192)
        t = torch.matmul(patches, self.embed_w.t())
        a = torch._native_multi_head_attention(t, t, t, 16, 2, self.qkv_w, self.qkv_b,
                                               self.proj_w, self.proj_b)[0]
        return torch.matmul(a.mean(1), self.head_w.t())
  )");
  const std::string path = dir.str("teacher.pt");
  m.save(path);
  const torch::Tensor images = torch::randn({2, 3, 32, 32});
  CHECK(InferenceModel::load(path, Precision::kFloat32)->forward(images).logits.size(1) == 10);
  const std::unique_ptr<InferenceModel> bf16 = InferenceModel::load(path, Precision::kBFloat16);
  CHECK_THROWS_WITH_AS(bf16->forward(images),
                       doctest::Contains("fails under autocast: bf16 (expected scalar type"),
                       flowtrain::Error);
  CHECK_THROWS_WITH_AS(bf16->forward(images),
                       doctest::Contains("set autocast: none for this stage"), flowtrain::Error);
}
