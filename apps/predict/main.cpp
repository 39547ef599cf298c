// flowtrain-predict: the top classes of images under a TorchScript model (a file from
// flowtrain's export_torchscript, or any model saved with torch.jit.save whose forward maps
// float32 images [B, 3, H, W] to logits, or to (logits, regression)).
//
//   (the work is flowtrain::train::Predictor, shared with foodtag predict)
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
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "graph/error.hpp"
#include "stages/data/transforms/normalizer.hpp"
#include "stages/train/inference/predictor.hpp"

namespace {

using flowtrain::Error;

struct Options {
  std::string model;
  std::vector<std::string> images;
  int top = 5;
  std::string labels;
  flowtrain::train::Predictor::Options predictor;
};

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

std::string class_name(std::int64_t index, const std::vector<std::string>& labels) {
  if (labels.empty()) return "class " + std::to_string(index);
  return labels[static_cast<std::size_t>(index)] + " (" + std::to_string(index) + ")";
}

int predict(const Options& o) {
  if (o.predictor.size < 0) throw Error("--size must be >= 1, got " + std::to_string(o.predictor.size));
  if (o.top < 1) throw Error("--top must be >= 1, got " + std::to_string(o.top));
  const flowtrain::train::Predictor predictor(o.model, o.predictor);
  const std::vector<std::string> labels =
      o.labels.empty() ? std::vector<std::string>{} : read_labels(o.labels);
  int failed = 0;
  for (const auto& p : predictor.predict(o.images, o.top)) {
    if (!p.error.empty()) {
      // The others are still tagged; the exit code says some were not.
      std::cout << std::flush;
      std::cerr << "flowtrain-predict: " << p.path << ": " << p.error << "\n";
      ++failed;
      continue;
    }
    if (!labels.empty() && static_cast<std::int64_t>(labels.size()) != p.class_count) {
      throw Error(o.labels + ": " + std::to_string(labels.size()) + " labels for a model with " +
                  std::to_string(p.class_count) + " classes");
    }
    std::cout << p.path << "\n";
    for (std::size_t k = 0; k < p.classes.size(); ++k) {
      char probability[32];
      std::snprintf(probability, sizeof probability, "%.4f", p.probabilities[k]);
      std::cout << "  " << probability << "  " << class_name(p.classes[k], labels) << "\n";
    }
    if (!p.regression.empty()) {
      std::cout << "  regression:";
      for (std::size_t r = 0; r < p.regression.size(); ++r) {
        std::cout << (r ? ", " : " ") << p.regression[r];
      }
      std::cout << "\n";
    }
  }
  std::cout << std::flush;
  return failed > 0 ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"flowtrain-predict: the top classes of images under a TorchScript model"};
  Options o;
  const flowtrain::data::NormalizeOptions normalize{};  // as collate and decode_crop normalise
  o.predictor.mean = normalize.mean;
  o.predictor.std = normalize.std;
  app.add_option("model", o.model, "TorchScript model file (.pt)")->required();
  app.add_option("images", o.images, "Image files (JPEG, PNG...)")->required();
  app.add_option("--size", o.predictor.size,
                 "Input side in pixels (default: the model's image_size, else 224)");
  app.add_option("--top", o.top, "Classes shown per image")->capture_default_str();
  app.add_option("--labels", o.labels, "Class names, one per line, in class-id order");
  app.add_option("--mean", o.predictor.mean, "Per-channel mean of pixel / 255 (R G B)")
      ->expected(3)
      ->capture_default_str();
  app.add_option("--std", o.predictor.std, "Per-channel std of pixel / 255 (R G B)")
      ->expected(3)
      ->capture_default_str();
  app.add_option("--min-side", o.predictor.min_side,
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
    return predict(o);
  } catch (const std::exception& e) {
    std::cerr << "flowtrain-predict: error: " << e.what() << "\n";
    return 1;
  }
}
