// flowtrain-predict: the top classes of images under a TorchScript model (a file from
// flowtrain's export_torchscript, or any model saved with torch.jit.save whose forward maps
// float32 images [B, 3, H, W] to logits, or to (logits, regression)).
//
//   MODEL.pt ---------------------------------------------------> ScriptedModel (eval, no grad)
//                                                                        |
//   IMAGE... -> read_file -> decode_image -> eval view -> normalise -> forward (16 at a time)
//               (the jpeg_decode stage's    (augment, mode eval:     (collate's     |
//                reader and decoder)         resize + centre crop)   mean / std)    v
//                                                              softmax -> top-k per image
//                                                                    (+ the regression output)
//
// Run: flowtrain-predict MODEL.pt IMAGE... [--size 112] [--top 5] [--labels labels.txt]
//                        [--mean 0.485 0.456 0.406] [--std 0.229 0.224 0.225] [--min-side N]
//
//   photo.jpg
//     0.8123  cheese (2)
//     0.1002  bread (1)
//     regression: 412.5
//
// --size defaults to the model's `image_size` attribute (files from export_torchscript have
// one), else 224; --min-side (the DCT-scaled JPEG decode, as jpeg_decode's min_side) to --size,
// as the configs in apps/flowtrain/configs do. Every default not given here is the stage's own
// (augment's eval_crop, collate's mean and std), read from their declared parameters.
// Errors print one line and exit 1.
#include <torch/script.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <span>
#include <string>
#include <vector>

#include "graph/error.hpp"
#include "graph/params.hpp"
#include "stages/data/augment.hpp"
#include "stages/data/collate.hpp"
#include "stages/data/jpeg_decode.hpp"
#include "stages/train/torchscript.hpp"

namespace {

using flowtrain::Error;
namespace data = flowtrain::data;

constexpr std::size_t kBatch = 16;  // images per forward: bounds memory for long image lists

struct Options {
  std::string model;
  std::vector<std::string> images;
  int size = 0;  // 0: the model's image_size, else 224
  int top = 5;
  int min_side = -1;  // -1: --size
  std::string labels;
  std::vector<double> mean;
  std::vector<double> std;
};

// A stage's declared default, so the app and a pipeline config preprocess alike.
template <class T>
T stage_default(const flowtrain::StageDoc& doc, const std::string& name) {
  return flowtrain::Params::defaults(doc.params).get<T>(name);
}

std::vector<std::string> read_labels(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(path + ": cannot read labels");
  std::vector<std::string> labels;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    labels.push_back(line);
  }
  while (!labels.empty() && labels.back().empty()) labels.pop_back();
  return labels;
}

// Decodes the file at `path` and makes its eval view: what jpeg_decode then augment (mode eval)
// give a pipeline.
data::Image eval_view(const std::string& path,
                      const data::DecodeOptions& decode,
                      const data::AugmentPolicy& policy,
                      int size) {
  std::vector<std::uint8_t> buffer;
  std::span<const std::uint8_t> bytes;
  if (const std::error_code error = data::read_file(path, buffer, bytes)) {
    throw Error(path + ": cannot read file: " + error.message());
  }
  data::Image decoded;
  if (const data::DecodeResult result = data::decode_image(bytes, decode, decoded); !result.ok()) {
    throw Error(path + ": " + result.error);
  }
  const double aspect = static_cast<double>(decoded.width) / decoded.height;
  data::Image view;
  data::apply_augment(decoded, policy.draw(/*index=*/0, /*epoch=*/0, aspect), size, view);
  return view;
}

std::string class_name(std::int64_t index, const std::vector<std::string>& labels) {
  if (labels.empty()) return "class " + std::to_string(index);
  return labels[static_cast<std::size_t>(index)] + " (" + std::to_string(index) + ")";
}

int predict(Options o) {
  const flowtrain::train::ScriptedModel model(o.model);
  if (o.size == 0) o.size = model.image_size().value_or(224);
  if (o.size < 1) throw Error("--size must be >= 1, got " + std::to_string(o.size));
  if (o.top < 1) throw Error("--top must be >= 1, got " + std::to_string(o.top));
  const data::Normalizer normalize(o.mean, o.std);
  const std::vector<std::string> labels =
      o.labels.empty() ? std::vector<std::string>{} : read_labels(o.labels);

  data::DecodeOptions decode;
  decode.min_side = o.min_side < 0 ? o.size : o.min_side;
  data::AugmentPolicy::Options augment;
  augment.mode = data::AugmentPolicy::Mode::kEval;
  augment.eval_crop = stage_default<double>(data::AugmentStage::describe(), "eval_crop");
  const data::AugmentPolicy policy(augment);

  for (std::size_t first = 0; first < o.images.size(); first += kBatch) {
    const std::size_t count = std::min(kBatch, o.images.size() - first);
    torch::Tensor images = torch::empty({static_cast<std::int64_t>(count), 3, o.size, o.size});
    for (std::size_t i = 0; i < count; ++i) {
      const data::Image view = eval_view(o.images[first + i], decode, policy, o.size);
      normalize(view, images[static_cast<std::int64_t>(i)].data_ptr<float>());
    }
    const flowtrain::train::ViTOutput out = model.forward(images);
    const std::int64_t classes = out.logits.size(1);
    if (!labels.empty() && static_cast<std::int64_t>(labels.size()) != classes) {
      throw Error(o.labels + ": " + std::to_string(labels.size()) + " labels for a model with " +
                  std::to_string(classes) + " classes");
    }
    const torch::Tensor probabilities = out.logits.to(torch::kFloat).softmax(1);
    const auto [values, indices] = probabilities.topk(std::min<std::int64_t>(o.top, classes), 1);
    for (std::size_t i = 0; i < count; ++i) {
      const auto row = static_cast<std::int64_t>(i);
      std::cout << o.images[first + i] << "\n";
      for (std::int64_t k = 0; k < values.size(1); ++k) {
        char probability[32];
        std::snprintf(probability, sizeof probability, "%.4f", values[row][k].item<double>());
        std::cout << "  " << probability << "  "
                  << class_name(indices[row][k].item<std::int64_t>(), labels) << "\n";
      }
      if (out.regression.defined()) {
        std::cout << "  regression:";
        for (std::int64_t r = 0; r < out.regression.size(1); ++r) {
          std::cout << (r ? ", " : " ") << out.regression[row][r].item<double>();
        }
        std::cout << "\n";
      }
    }
    std::cout << std::flush;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"flowtrain-predict: the top classes of images under a TorchScript model"};
  Options o;
  o.mean = stage_default<std::vector<double>>(data::CollateStage::describe(), "mean");
  o.std = stage_default<std::vector<double>>(data::CollateStage::describe(), "std");
  app.add_option("model", o.model, "TorchScript model file (.pt)")->required();
  app.add_option("images", o.images, "Image files (JPEG, PNG...)")->required();
  app.add_option("--size", o.size,
                 "Input side in pixels (default: the model's image_size, else 224)");
  app.add_option("--top", o.top, "Classes shown per image")->capture_default_str();
  app.add_option("--labels", o.labels, "Class names, one per line, in class-id order");
  app.add_option("--mean", o.mean, "Per-channel mean of pixel / 255 (R G B)")
      ->expected(3)
      ->capture_default_str();
  app.add_option("--std", o.std, "Per-channel std of pixel / 255 (R G B)")
      ->expected(3)
      ->capture_default_str();
  app.add_option("--min-side", o.min_side,
                 "Shorter side a JPEG keeps when decoded at a reduced scale (default: --size; "
                 "0: full size)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::cerr << "flowtrain-predict: error: " << e.what() << " (see --help)\n";
    return 1;
  }
  try {
    return predict(std::move(o));
  } catch (const std::exception& e) {
    std::cerr << "flowtrain-predict: error: " << e.what() << "\n";
    return 1;
  }
}
