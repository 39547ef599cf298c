#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace flowtrain::data {

/// An 8-bit image in memory, interleaved (HWC) RGB once decoded. Plain memory, so the stages
/// that only carry it need neither OpenCV nor LibTorch; image stages wrap it in a cv::Mat
/// header without copying.
struct Image {
  int width = 0;
  int height = 0;
  int channels = 0;
  std::vector<std::uint8_t> pixels;  // height * width * channels bytes

  bool empty() const { return pixels.empty(); }
};

/// The random choices augmentation made for one sample, as fractions of the decoded image, so
/// they do not depend on the DCT scale the decoder picked. Derived from (seed, epoch, index)
/// alone; they travel with the sample because a teacher-output cache must key on the exact view.
struct AugmentParams {
  float crop_x = 0;  // left edge, fraction of the width
  float crop_y = 0;  // top edge, fraction of the height
  float crop_w = 1;  // fraction of the width
  float crop_h = 1;  // fraction of the height
  bool flip = false;
  float brightness = 1;
  float contrast = 1;
  float saturation = 1;

  bool operator==(const AugmentParams&) const = default;
};

/// One training example as it flows from a source through decode and augment to collate.
struct Sample {
  std::uint64_t index = 0;  // position in the whole dataset: stable across epochs and ranks
  std::uint32_t epoch = 0;
  std::string path;         // the file, or "shard.ftpk#17" for a packed record; for messages
  std::int64_t label = -1;  // class id
  std::vector<float> targets;          // numeric targets (e.g. energy in kcal), may be empty
  std::vector<std::uint8_t> encoded;   // the file's bytes; empty means decode reads `path`
  Image image;                         // decoded pixels, then the augmented view
  AugmentParams augment;               // what augment did (identity until then)
};

}  // namespace flowtrain::data
