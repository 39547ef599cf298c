#pragma once

#include <torch/types.h>

#include <memory>
#include <string>
#include <vector>

#include "stages/train/files/torchscript.hpp"

namespace flowtrain::train {

/// How a Predictor preprocesses images.
struct PredictorOptions {
  int size = 0;       // input side (0: the model's image_size attribute, else 224)
  /// Shorter side a JPEG keeps when DCT-scaled (-1: ceil(size / eval_crop), what the eval view
  /// needs to be a downscale; 0: full size).
  int min_side = -1;
  std::vector<double> mean, std;  // per channel of pixel / 255 (empty: collate's defaults)
};

/// Tags image files with a TorchScript model (a file from export_torchscript, or any model saved
/// with torch.jit.save whose forward maps float32 images [B, 3, H, W] to logits, or to
/// (logits, regression)), preprocessing them as an eval pipeline does: jpeg_decode's reader and
/// decoder, augment's eval view (resize + centre crop), collate's normalisation.
///
///   Predictor predictor("runs/foodtag/student.pt");
///   for (const Prediction& p : predictor.predict({"photo.jpg"}, /*top=*/3)) ...
class Predictor {
 public:
  using Options = PredictorOptions;
  /// One image's result.
  struct Prediction {
    std::string path;
    std::vector<std::int64_t> classes;   // the top classes, most probable first
    std::vector<double> probabilities;   // of those classes
    std::vector<double> regression;      // the regression head's outputs (empty: none)
    std::int64_t class_count = 0;        // classes the model has
    std::string error;  // why the image could not be tagged ("cannot read file: ..."); else empty
  };

  /// Throws Error naming the file: missing, not TorchScript, no forward.
  explicit Predictor(const std::string& model_path, Options options = {});
  ~Predictor();

  /// The top `top` classes of each image, in order, 16 images per forward. An image that cannot
  /// be read or decoded gets its `error` and the others are still tagged. Throws Error for a
  /// model whose forward does not give logits.
  std::vector<Prediction> predict(const std::vector<std::string>& paths, int top) const;

  int image_size() const { return size_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int size_ = 0;
};

}  // namespace flowtrain::train
