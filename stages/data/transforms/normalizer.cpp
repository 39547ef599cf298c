#include "stages/data/transforms/normalizer.hpp"

#include <opencv2/core.hpp>

#include "graph/error.hpp"

namespace flowtrain::data {

Normalizer::Normalizer(const std::vector<double>& mean, const std::vector<double>& std) {
  if (mean.size() != 3 || std.size() != 3) {
    throw Error("params 'mean' and 'std' need 3 values (R, G, B)");
  }
  for (int c = 0; c < 3; ++c) {
    if (!(std[c] > 0)) throw Error("param 'std' values must be > 0");
    scale_[c] = static_cast<float>(1.0 / (255.0 * std[c]));
    bias_[c] = static_cast<float>(-mean[c] / std[c]);
  }
}

Normalizer::Normalizer(const NormalizeOptions& options) : Normalizer(options.mean, options.std) {}

void Normalizer::operator()(const Image& img, float* chw) const {
  // Split into channel planes, then one scaled conversion per plane into the output memory.
  const cv::Mat rgb(img.height, img.width, CV_8UC3, const_cast<std::uint8_t*>(img.pixels.data()));
  thread_local cv::Mat planes[3];  // scratch, reused
  cv::split(rgb, planes);
  const std::int64_t plane_size = std::int64_t{img.height} * img.width;
  for (int c = 0; c < 3; ++c) {
    cv::Mat plane(img.height, img.width, CV_32F, chw + c * plane_size);
    planes[c].convertTo(plane, CV_32F, scale_[c], bias_[c]);
  }
}

}  // namespace flowtrain::data
