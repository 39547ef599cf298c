#pragma once

// Helpers of the training tests: temp folders, a small generated image set, and pipelines run
// from config text.

#include <doctest/doctest.h>
#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "graph/config.hpp"
#include "graph/pipeline.hpp"
#include "stages/data/sources/synthetic.hpp"
#include "tests/stage_result.hpp"

namespace flowtrain::testing {

// A fresh folder under the system temp dir, removed with everything in it at scope exit.
class TempDir {
 public:
  explicit TempDir(const char* tag = "train") {
    std::string pattern =
        (std::filesystem::temp_directory_path() / (std::string("flowtrain-") + tag + "-XXXXXX"))
            .string();
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Synthetic 4-class JPEGs, 40x40: `train` (320 images) and `val` (160, another seed) folders,
// written once per test process and shared by the tests.
inline const std::string& synthetic_images() {
  static TempDir dir("images");
  static const bool written = [] {
    data::SyntheticOptions options;
    options.width = options.height = 40;
    options.classes = 4;
    options.root = dir / "train";
    options.count = 320;
    options.seed = 1;
    data::generate_jpeg_dataset(options);
    options.root = dir / "val";
    options.count = 160;
    options.seed = 2;
    data::generate_jpeg_dataset(options);
    return true;
  }();
  (void)written;
  return dir.path();
}

// The data stages of a training pipeline over `split` of synthetic_images(), as config text.
inline std::string data_stages(const std::string& split, int epochs, bool train) {
  return "  - {type: image_folder, name: source, params: {root: " + synthetic_images() + "/" +
         split + ", epochs: " + std::to_string(epochs) + ", seed: 3, shuffle: " +
         (train ? "true" : "false") +
         "}}\n"
         "  - {type: jpeg_decode, concurrency: 2}\n"
         "  - {type: augment, concurrency: 2, params: {size: 32, mode: " +
         (train ? "train, scale: [0.6, 1.0]" : "eval, eval_crop: 1.0") +
         "}}\n"
         "  - {type: collate, params: {batch_size: 32, pool_size: 8}}\n";
}

// Builds and runs a pipeline config given as text.
inline RunReport run_config(const std::string& text) {
  const PipelineConfig config = parse_pipeline_config(text, "test.yaml");
  std::unique_ptr<Pipeline> pipeline = build_pipeline(config);
  return pipeline->run(config.run);
}

}  // namespace flowtrain::testing
