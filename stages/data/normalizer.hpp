#pragma once

#include <vector>

#include "graph/params.hpp"
#include "stages/data/sample.hpp"

namespace flowtrain::data {

/// (pixel / 255 - mean) / std, fused with the HWC -> CHW copy: how a batch row is filled
/// (collate, decode_crop), and how code that prepares single images does it (a predict tool).
///
///   const Normalizer normalize({0.485, 0.456, 0.406}, {0.229, 0.224, 0.225});
///   normalize(image, row.data_ptr<float>());  // row: [3, H, W] float32
class Normalizer {
 public:
  /// Throws Error unless mean and std have 3 values (R, G, B) and every std is > 0.
  Normalizer(const std::vector<double>& mean, const std::vector<double>& std);
  /// From the `mean` and `std` params (normalize_param_specs).
  explicit Normalizer(const Params& params);
  /// Writes the 3 x height x width floats of an RGB image to `chw`.
  void operator()(const Image& rgb, float* chw) const;

 private:
  float scale_[3];
  float bias_[3];
};

/// The `mean` and `std` params of the stages that normalise.
std::vector<ParamSpec> normalize_param_specs();

}  // namespace flowtrain::data
