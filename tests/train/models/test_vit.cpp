#include <doctest/doctest.h>
#include <torch/torch.h>

#include <cmath>
#include <map>
#include <string>

#include "graph/error.hpp"
#include "stages/train/models/compute.hpp"
#include "stages/train/models/vit.hpp"

using namespace flowtrain;
using namespace flowtrain::train;

namespace {

// The parameter count of a class-token ViT, from its shape alone.
std::int64_t expected_parameters(const ModelConfig& c) {
  const std::int64_t d = c.dim;
  const std::int64_t hidden = c.mlp_hidden();
  const std::int64_t patch_embed = std::int64_t{c.channels} * c.patch_size * c.patch_size * d + d;
  const std::int64_t tokens = d + (1 + c.patches()) * d;  // class token + position embedding
  const std::int64_t block = 2 * (2 * d)                  // two LayerNorms
                             + (d * 3 * d + 3 * d)        // qkv
                             + (d * d + d)                // attention projection
                             + (d * hidden + hidden) + (hidden * d + d);  // MLP
  const std::int64_t heads =
      (d * c.classes + c.classes) + (d * c.regression_outputs + c.regression_outputs);
  return patch_embed + tokens + c.depth * block + 2 * d + heads;
}

ModelConfig small_config(int regression_outputs) {
  return ModelConfig{.image_size = 32,
                   .patch_size = 8,
                   .dim = 32,
                   .depth = 2,
                   .heads = 4,
                   .classes = 5,
                   .regression_outputs = regression_outputs};
}

std::map<std::string, torch::Tensor> parameters_of(ViT& model) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : model->named_parameters()) out[item.key()] = item.value();
  return out;
}

}  // namespace

TEST_CASE("Train.ViT.PresetParameterCounts") {
  // timm's vit_tiny/small/base_patch16_224 at 1000 classes.
  const std::pair<std::string, std::int64_t> presets[] = {
      {"vit_ti", 5'717'416}, {"vit_s", 22'050'664}, {"vit_b", 86'567'656}};
  for (const auto& [name, count] : presets) {
    CAPTURE(name);
    const ViT model(model_config(name, 224, 1000));
    CHECK(parameter_count(*model) == count);
    CHECK(expected_parameters(model->config()) == count);
  }
  // The CPU presets have no published counts; check them against the closed form.
  for (const std::string name : {"vit_cpu_teacher", "vit_cpu_student"}) {
    CAPTURE(name);
    ModelConfig config = model_config(name, 224, 101);
    config.regression_outputs = 1;
    const ViT model(config);
    CHECK(parameter_count(*model) == expected_parameters(config));
    MESSAGE(name << " at 224 px, 101 classes + 1 regression output: " << parameter_count(*model)
                 << " parameters");
  }
}

TEST_CASE("Train.ViT.FlopsFromTheShape") {
  // 32 px, patch 8: 16 patches + the class token = 17 tokens; dim 64, MLP 256, 2 blocks.
  ModelConfig c{.image_size = 32, .patch_size = 8, .dim = 64, .depth = 2, .heads = 4,
              .classes = 10};
  const std::int64_t block = 2 * 17 * 64 * 192     // qkv
                             + 2 * 2 * 17 * 17 * 64  // q k^T, attention x v
                             + 2 * 17 * 64 * 64      // projection
                             + 2 * 2 * 17 * 64 * 256;  // MLP
  const std::int64_t patch_embed = 2 * 16 * (3 * 8 * 8) * 64;
  CHECK(c.forward_flops() == patch_embed + 2 * block + 2 * 64 * 10);
  CHECK(c.forward_flops() == 3'884'800);
  // Backward: both operands' gradients of every product but the images'.
  CHECK(c.train_flops() == 3 * c.forward_flops() - patch_embed);
  c.regression_outputs = 1;
  CHECK(c.forward_flops() == 3'884'800 + 2 * 64);
  // The bench teacher: about two thirds of a bench-small distillation step (1.11 + 0.58 G).
  CHECK(model_config("vit_cpu_teacher", 112, 10).forward_flops() == 1'113'632'256);
  CHECK(model_config("vit_cpu_student", 112, 10).train_flops() == 582'794'496);
}

TEST_CASE("Train.ViT.ForwardShapes") {
  at::set_num_threads(1);
  torch::manual_seed(0);
  const torch::Tensor images = torch::randn({3, 3, 32, 32});

  SUBCASE("with a regression head") {
    ViT model(small_config(2));
    const ModelOutput out = model(images);
    CHECK(out.logits.sizes() == torch::IntArrayRef({3, 5}));
    REQUIRE(out.regression.defined());
    CHECK(out.regression.sizes() == torch::IntArrayRef({3, 2}));
    // Every parameter takes part in the loss.
    (out.logits.sum() + out.regression.sum()).backward();
    for (const auto& item : model->named_parameters()) {
      CAPTURE(item.key());
      REQUIRE(item.value().grad().defined());
      CHECK(item.value().grad().abs().sum().item<double>() > 0);
    }
  }
  SUBCASE("without a regression head") {
    ViT model(small_config(0));
    model->eval();
    const ModelOutput out = model(images);
    CHECK(out.logits.sizes() == torch::IntArrayRef({3, 5}));
    CHECK_FALSE(out.regression.defined());
    // A sample's logits do not depend on the rest of the batch.
    const ModelOutput single = model(images.slice(0, 1, 2));
    CHECK(torch::allclose(single.logits, out.logits.slice(0, 1, 2), 1e-5, 1e-6));
  }
  SUBCASE("a wrong image size is an Error") {
    ViT model(small_config(0));
    CHECK_THROWS_WITH_AS(model(torch::zeros({2, 3, 64, 64})),
                         "ViT: expected images [B, 3, 32, 32], got [2, 3, 64, 64]", Error);
  }
}

TEST_CASE("Train.ViT.DeterministicInit") {
  const ModelConfig config = model_config("vit_cpu_student", 64, 10);
  torch::manual_seed(42);
  ViT first(config);
  torch::manual_seed(42);
  ViT second(config);
  torch::manual_seed(43);
  ViT other(config);

  const auto a = parameters_of(first);
  const auto b = parameters_of(second);
  const auto c = parameters_of(other);
  REQUIRE(a.size() == b.size());
  for (const auto& [name, tensor] : a) {
    CAPTURE(name);
    CHECK(torch::equal(tensor, b.at(name)));  // bitwise
  }
  CHECK_FALSE(torch::equal(a.at("blocks.0.attn.qkv.weight"), c.at("blocks.0.attn.qkv.weight")));
}

TEST_CASE("Train.ViT.InitLikeTimm") {
  torch::manual_seed(1);
  ModelConfig config = model_config("vit_cpu_student", 224, 10);
  config.regression_outputs = 1;
  ViT model(config);
  const auto p = parameters_of(model);
  // timm's names, so a timm state dict maps one to one.
  for (const char* name :
       {"cls_token", "pos_embed", "patch_embed.proj.weight", "blocks.3.norm1.weight",
        "blocks.0.attn.qkv.weight", "blocks.0.attn.proj.bias", "blocks.0.mlp.fc1.weight",
        "blocks.0.mlp.fc2.bias", "norm.bias", "head.weight", "regression_head.weight"}) {
    const std::string key = name;
    CAPTURE(key);
    CHECK(p.count(name) == 1);
  }
  for (const auto& [name, tensor] : p) {
    CAPTURE(name);
    const bool layer_norm = name.find("norm") != std::string::npos;
    const bool bias = name.ends_with(".bias");
    if (name.starts_with("patch_embed")) continue;  // LibTorch's default Conv2d init, as timm
    if (layer_norm) {
      CHECK(torch::all(tensor == (bias ? 0.0 : 1.0)).item<bool>());
    } else if (bias) {
      CHECK(torch::all(tensor == 0).item<bool>());
    } else {
      // Truncated normal, std 0.02, cut at two standard deviations.
      CHECK(tensor.abs().max().item<double>() <= 0.04 + 1e-7);
      if (tensor.numel() >= 10'000) {
        // The std of N(0, 0.02) truncated at +-2 sigma is 0.02 * 0.8796.
        CHECK(tensor.std().item<double>() == doctest::Approx(0.02 * 0.8796).epsilon(0.03));
        CHECK(std::abs(tensor.mean().item<double>()) < 5e-4);
      }
    }
  }
}

TEST_CASE("Train.ViT.Bf16PatchEmbeddingIsOneMatrixProduct") {
  torch::manual_seed(5);
  PatchEmbed embed(3, 32, 8);
  const torch::Tensor images = torch::randn({4, 3, 32, 32});
  const auto weight_grads = [&](const torch::Tensor& tokens) {
    embed->zero_grad();
    tokens.to(torch::kFloat).mul(torch::linspace(-1, 1, 32)).sum().backward();
    return std::pair{embed->named_parameters()["proj.weight"].grad().clone(),
                     embed->named_parameters()["proj.bias"].grad().clone()};
  };
  const torch::Tensor exact = embed(images);  // float32: the convolution
  const auto [exact_weight, exact_bias] = weight_grads(exact);

  Autocast bf16(c10::kBFloat16);
  const torch::Tensor tokens = embed(images);
  CHECK(tokens.sizes() == torch::IntArrayRef{4, 16, 32});
  CHECK((tokens.scalar_type() == torch::kBFloat16));
  // No convolution in its backward, nor anywhere before it.
  std::vector<torch::autograd::Node*> nodes = {tokens.grad_fn().get()};
  while (!nodes.empty()) {
    torch::autograd::Node* node = nodes.back();
    nodes.pop_back();
    CAPTURE(node->name());
    CHECK(node->name().find("Convolution") == std::string::npos);
    for (const torch::autograd::Edge& edge : node->next_edges()) {
      if (edge.function) nodes.push_back(edge.function.get());
    }
  }
  // The convolution's values and gradients, within bf16's rounding (each factor to 8 bits:
  // relative errors ~2^-8, far below the bound).
  const auto relative_error = [](const torch::Tensor& a, const torch::Tensor& b) {
    return (a.to(torch::kFloat) - b).norm().item<double>() / b.norm().item<double>();
  };
  CHECK(relative_error(tokens, exact) < 0.02);
  const auto [weight, bias] = weight_grads(tokens);
  CHECK(relative_error(weight, exact_weight) < 0.02);
  CHECK(relative_error(bias, exact_bias) < 0.02);
  CHECK((weight.scalar_type() == torch::kFloat));  // the parameters stay float32
}

TEST_CASE("Train.ViT.BadConfigErrors") {
  const ModelConfig good = small_config(1);
  CHECK_NOTHROW(good.validate());
  const auto fails = [](ModelConfig config, const std::string& message) {
    CAPTURE(message);
    CHECK_THROWS_WITH_AS(config.validate(), message.c_str(), Error);
    CHECK_THROWS_WITH_AS(ViT{config}, message.c_str(), Error);
  };
  ModelConfig c = good;
  c.image_size = 0;
  fails(c, "ModelConfig: image_size must be > 0 (got 0)");
  c = good;
  c.patch_size = -8;
  fails(c, "ModelConfig: patch_size must be > 0 (got -8)");
  c = good;
  c.channels = 0;
  fails(c, "ModelConfig: channels must be > 0 (got 0)");
  c = good;
  c.dim = 0;
  fails(c, "ModelConfig: dim must be > 0 (got 0)");
  c = good;
  c.depth = 0;
  fails(c, "ModelConfig: depth must be > 0 (got 0)");
  c = good;
  c.heads = 0;
  fails(c, "ModelConfig: heads must be > 0 (got 0)");
  c = good;
  c.classes = 0;
  fails(c, "ModelConfig: classes must be > 0 (got 0)");
  c = good;
  c.regression_outputs = -1;
  fails(c, "ModelConfig: regression_outputs must be >= 0 (got -1)");
  c = good;
  c.mlp_ratio = 0;
  fails(c, "ModelConfig: mlp_ratio must be > 0 (got 0.000000)");
  c = good;
  c.dropout = 1;
  fails(c, "ModelConfig: dropout must be in [0, 1) (got 1.000000)");
  c = good;
  c.image_size = 36;
  fails(c, "ModelConfig: image_size 36 is not divisible by patch_size 8");
  c = good;
  c.heads = 3;
  fails(c, "ModelConfig: dim 32 is not divisible by heads 3");
  // A field left out of a designated initializer is 0, and named.
  fails(ModelConfig{.image_size = 32, .dim = 32, .depth = 2, .heads = 4, .classes = 5},
        "ModelConfig: patch_size must be > 0 (got 0)");

  CHECK_THROWS_WITH_AS(model_config("vit_l", 224, 1000),
                       "unknown model preset 'vit_l' (known: vit_ti, vit_s, vit_b, vit_cpu_teacher, "
                       "vit_cpu_student, resnet18, resnet34)",
                       Error);
  CHECK_THROWS_WITH_AS(ViT(model_config("vit_ti", 225, 1000)),
                       "ModelConfig: image_size 225 is not divisible by patch_size 16", Error);
}

TEST_CASE("Train.ViT.DistillationTokenLikeDeiT") {
  ModelConfig config = small_config(1);
  config.distillation_token = true;
  torch::manual_seed(5);
  ViT model(config);
  // One more token (its own parameter and position) and a second head.
  ModelConfig plain = small_config(1);
  const std::int64_t extra = 2 * config.dim + (config.dim * config.classes + config.classes);
  CHECK(parameter_count(*model) == expected_parameters(plain) + extra);
  auto parameters = model->named_parameters();
  CHECK(parameters["pos_embed"].size(1) == 2 + config.patches());
  CHECK(parameters.contains("dist_token"));
  CHECK(parameters.contains("head_dist.weight"));

  const torch::Tensor images = torch::randn({3, 3, 32, 32});
  model->train();
  const ModelOutput train = model(images);
  REQUIRE(train.distillation.defined());
  CHECK(train.distillation.sizes() == train.logits.sizes());
  CHECK_FALSE(torch::equal(train.distillation, train.logits));
  // In eval mode the prediction is the mean of both heads, and no second output.
  model->eval();
  const ModelOutput eval = model(images);
  CHECK_FALSE(eval.distillation.defined());
  CHECK(torch::allclose(eval.logits, (train.logits + train.distillation) / 2, 1e-6, 1e-6));
  // One token more in every block, and the second head.
  CHECK(config.forward_flops() ==
        plain.forward_flops() + 2LL * config.dim * config.classes +
            config.depth * (2LL * config.dim * 3 * config.dim + 2LL * config.dim * config.dim +
                            4LL * config.dim * config.mlp_hidden()) +
            config.depth * 4LL * config.dim * ((2 + config.patches()) * (2 + config.patches()) -
                                               (1 + config.patches()) * (1 + config.patches())));
}

TEST_CASE("Train.ViT.DropPathOnlyInTrainingAndSeeded") {
  ModelConfig config = small_config(0);
  config.drop_path = 0.5;
  torch::manual_seed(2);
  ViT model(config);
  const torch::Tensor images = torch::randn({8, 3, 32, 32});
  model->eval();
  const torch::Tensor eval = model(images).logits;
  ModelConfig without = small_config(0);
  torch::manual_seed(2);
  ViT plain(without);
  plain->eval();
  // Same weights (drop path draws nothing at init); in eval it is the identity.
  CHECK(torch::equal(plain(images).logits, eval));
  model->train();
  torch::manual_seed(9);
  const torch::Tensor a = model(images).logits;
  torch::manual_seed(9);
  const torch::Tensor b = model(images).logits;
  CHECK(torch::equal(a, b));         // the same draws for the same seed
  CHECK_FALSE(torch::equal(a, eval));  // and some branch dropped
}
