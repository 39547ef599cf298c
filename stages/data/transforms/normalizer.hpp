#pragma once

#include <vector>

#include "graph/options.hpp"
#include "stages/data/sample.hpp"

namespace flowtrain::data {

/// The `mean` and `std` params of the stages that normalise (Normalizer).
struct NormalizeOptions {
  std::vector<double> mean = {0.485, 0.456, 0.406};
  std::vector<double> std = {0.229, 0.224, 0.225};
  template <class Declare>
  void declare(Declare& d) {
    d(mean, "mean", "per-channel mean (of pixel / 255)");
    d(std, "std", "per-channel std (of pixel / 255)");
  }
};

/// (pixel / 255 - mean) / std, fused with the HWC -> CHW copy: how a batch row is filled
/// (collate, decode_crop), and how code that prepares single images does it (a predict tool).
///
///   const Normalizer normalize({0.485, 0.456, 0.406}, {0.229, 0.224, 0.225});
///   normalize(image, row.data_ptr<float>());  // row: [3, H, W] float32
class Normalizer {
 public:
  /// Throws Error unless mean and std have 3 values (R, G, B) and every std is > 0.
  Normalizer(const std::vector<double>& mean, const std::vector<double>& std);
  /// From a stage's `mean` and `std` options; throws the same.
  explicit Normalizer(const NormalizeOptions& options);
  /// Writes the 3 x height x width floats of an RGB image to `chw`.
  void operator()(const Image& rgb, float* chw) const;
  /// The float map of channel c: out = pixel * scale(c) + bias(c), as one fused multiply-add.
  float scale(int c) const { return scale_[c]; }
  float bias(int c) const { return bias_[c]; }

 private:
  float scale_[3];
  float bias_[3];
};

}  // namespace flowtrain::data
