#include <doctest/doctest.h>
#include <torch/torch.h>

#include <limits>
#include <string>

#include "graph/error.hpp"
#include "stages/train/models/compute.hpp"
#include "stages/train/models/model.hpp"
#include "stages/train/models/resnet.hpp"

using namespace flowtrain;
using namespace flowtrain::train;

namespace {

ModelConfig small_resnet(const std::string& stem = "compact") {
  return ModelConfig{.arch = "resnet",
                     .image_size = 32,
                     .dim = 8,
                     .classes = 5,
                     .regression_outputs = 1,
                     .stage_blocks = {1, 2},
                     .stem = stem};
}

}  // namespace

TEST_CASE("Train.ResNet.PresetsMatchTorchvision") {
  // torchvision.models.resnet18/34(num_classes=C): parameters, and the FLOPs of their
  // convolutions and fc at batch 1 (forward hooks, 2 per multiply-add), printed by PyTorch 1.13.
  struct Expected {
    const char* name;
    int size, classes;
    std::int64_t parameters, flops;
  };
  const Expected expected[] = {{"resnet18", 224, 1000, 11'689'512, 3'628'146'688},
                               {"resnet18", 96, 20, 11'186'772, 666'226'688},
                               {"resnet34", 224, 1000, 21'797'672, 7'327'522'816},
                               {"resnet34", 96, 20, 21'294'932, 1'345'703'936}};
  for (const Expected& e : expected) {
    CAPTURE(e.name);
    CAPTURE(e.size);
    const ModelConfig config = model_config(e.name, e.size, e.classes);
    const ImageModel model = make_model(config);
    CHECK(parameter_count(*model) == e.parameters);
    CHECK(config.forward_flops() == e.flops);
    // Backward: twice the forward, but the stem's gradient with respect to the images.
    CHECK(config.train_flops() == 3 * e.flops - 2LL * 7 * 7 * 3 * 64 * (e.size / 2) * (e.size / 2));
  }
}

TEST_CASE("Train.Model.MinParametersIsATightLowerBound") {
  // What a checkpoint's config is checked against its file's size with: never above the real
  // count (a good file would be refused), and not far below it (a damaged one must not pass).
  for (const std::string& preset : model_presets()) {
    for (const bool token : {false, true}) {
      CAPTURE(preset);
      ModelConfig config = model_config(preset, 112, 20);
      config.regression_outputs = 1;
      if (token && !config.is_vit()) continue;
      config.distillation_token = token;
      const std::int64_t real = parameter_count(*make_model(config));
      CHECK(config.min_parameters() <= real);
      CHECK(config.min_parameters() >= real * (config.is_vit() ? 0.9 : 0.45));
    }
  }
  ModelConfig huge = model_config("vit_ti", 224, 1000);
  huge.dim = 1 << 16;
  huge.depth = 1 << 10;
  CHECK(huge.min_parameters() > (std::int64_t{1} << 42));
  huge.depth = std::numeric_limits<int>::max();
  huge.mlp_ratio = 1e300;
  CHECK(huge.min_parameters() == std::numeric_limits<std::int64_t>::max());  // saturates
}

TEST_CASE("Train.ResNet.ForwardShapesAndNames") {
  for (const std::string stem : {"compact", "imagenet"}) {
    CAPTURE(stem);
    torch::manual_seed(1);
    const ModelConfig config = small_resnet(stem);
    ImageModel model = make_model(config);
    const ModelOutput out = model->forward(torch::randn({4, 3, 32, 32}));
    CHECK(out.logits.sizes() == torch::IntArrayRef{4, 5});
    CHECK(out.regression.sizes() == torch::IntArrayRef{4, 1});
    CHECK_FALSE(out.distillation.defined());
    // torchvision's names, buffers included.
    const auto parameters = model->named_parameters();
    CHECK(parameters.contains("conv1.weight"));
    CHECK(parameters.contains("layer2.0.downsample.0.weight"));
    CHECK(parameters.contains("layer2.1.bn2.bias"));
    CHECK(parameters.contains("fc.weight"));
    CHECK(parameters.contains("regression_head.bias"));
    CHECK_FALSE(parameters.contains("layer1.0.downsample.0.weight"));  // same width, stride 1
    CHECK(model->named_buffers().contains("layer1.0.bn1.running_var"));
    // Each block starts as the identity: its last BatchNorm's scale is 0.
    CHECK(parameters["layer2.1.bn2.weight"].abs().sum().item<double>() == 0);
    CHECK(parameters["layer2.1.bn1.weight"].min().item<double>() == 1);
  }
  CHECK_THROWS_WITH_AS(make_model(small_resnet())->forward(torch::zeros({1, 3, 16, 16})),
                       "ResNet: expected images [B, 3, 32, 32], got [1, 3, 16, 16]", Error);
}

TEST_CASE("Train.ResNet.DeterministicInitAndTrainingMode") {
  torch::manual_seed(3);
  ImageModel a = make_model(small_resnet());
  torch::manual_seed(3);
  ImageModel b = make_model(small_resnet());
  const auto pa = a->named_parameters();
  for (const auto& item : b->named_parameters()) {
    CAPTURE(item.key());
    CHECK(torch::equal(item.value(), pa[item.key()]));
  }
  // Training updates BatchNorm's running statistics; eval uses them, so one image's output
  // does not depend on the rest of its batch.
  const torch::Tensor images = torch::randn({6, 3, 32, 32});
  a->train();
  a->forward(images);
  CHECK(a->named_buffers()["bn1.num_batches_tracked"].item<std::int64_t>() == 1);
  CHECK(a->named_buffers()["bn1.running_mean"].abs().sum().item<double>() > 0);
  a->eval();
  const torch::Tensor whole = a->forward(images).logits;
  CHECK(torch::allclose(a->forward(images.narrow(0, 2, 1)).logits, whole.narrow(0, 2, 1), 1e-5,
                        1e-6));
}

TEST_CASE("Train.ResNet.Bf16RunsChannelsLastAndKeepsItsParametersLayout") {
  torch::manual_seed(4);
  ImageModel model = make_model(small_resnet());
  {  // like a trained model: blocks that are not the identity
    torch::NoGradGuard no_grad;
    for (torch::Tensor& p : model->parameters()) p.add_(torch::randn_like(p), 0.1);
  }
  model->eval();
  const torch::Tensor images = torch::randn({4, 3, 32, 32});
  const auto features = [&] { return model->run_blocks(model->embed(images), 0, model->blocks()); };
  CHECK(features().is_contiguous());  // float32: NCHW, as before
  const torch::Tensor exact = model->forward(images).logits;

  Autocast bf16(c10::kBFloat16);
  // Where this LibTorch's bf16 convolution keeps a channels-last input so (oneDNN's does; a
  // CPU without AVX-512 may take another kernel), the whole network runs channels-last.
  const torch::Tensor probe =
      torch::conv2d(torch::randn({1, 8, 6, 6}).contiguous(torch::MemoryFormat::ChannelsLast),
                    torch::randn({8, 8, 3, 3}));
  if (probe.is_contiguous(torch::MemoryFormat::ChannelsLast)) {
    CHECK(features().is_contiguous(torch::MemoryFormat::ChannelsLast));
  }
  const ModelOutput out = model->forward(images);
  // bf16's rounding of the float32 outputs (as the bf16 teacher's in test_inference_model.cpp).
  CHECK((out.logits.to(torch::kFloat) - exact).norm().item<double>() <
        0.03 * exact.norm().item<double>());
  // Parameters and gradients stay contiguous, as gradient sync and checkpoints read them.
  (out.logits.to(torch::kFloat).square().sum() + out.regression.to(torch::kFloat).sum()).backward();
  for (const auto& item : model->named_parameters()) {
    CAPTURE(item.key());
    REQUIRE(item.value().grad().defined());
    CHECK(item.value().is_contiguous());
    CHECK(item.value().grad().is_contiguous());
  }
}

TEST_CASE("Train.ResNet.BadConfigErrors") {
  const auto fails = [](const ModelConfig& c, const std::string& message) {
    CHECK_THROWS_WITH_AS(c.validate(), message.c_str(), Error);
  };
  ModelConfig c = small_resnet();
  c.heads = 4;
  fails(c, "ModelConfig: heads does not apply to arch 'resnet'");
  c = small_resnet();
  c.distillation_token = true;
  fails(c, "ModelConfig: distillation_token does not apply to arch 'resnet'");
  c = small_resnet();
  c.stage_blocks = {};
  fails(c, "ModelConfig: stage_blocks is empty");
  c = small_resnet();
  c.stage_blocks = {2, 0};
  fails(c, "ModelConfig: stage_blocks must be > 0 (got 0)");
  c = small_resnet();
  c.stem = "big";
  fails(c, "ModelConfig: stem must be imagenet or compact (got 'big')");
  c = small_resnet();
  c.arch = "convnext";
  fails(c, "ModelConfig: arch must be vit, resnet or torchscript (got 'convnext')");
  CHECK_THROWS_WITH_AS(model_config("resnet50", 96, 20),
                       doctest::Contains("unknown model preset 'resnet50' (known: vit_ti"), Error);
}
