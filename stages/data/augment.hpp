#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "graph/registry.hpp"
#include "stages/data/sample.hpp"

namespace flowtrain::data {

/// Draws the augmentation of one sample from (seed, epoch, index) alone, so a view is the same
/// whatever the concurrency or timing. `aspect` is the decoded image's width / height.
class AugmentPolicy {
 public:
  enum class Mode { kTrain, kEval };
  struct Options {
    Mode mode = Mode::kTrain;
    std::vector<double> scale{0.08, 1.0};                 // RandomResizedCrop area fraction range
    std::vector<double> ratio{3.0 / 4, 4.0 / 3};          // RandomResizedCrop aspect range
    double flip = 0.5;                                    // probability of a horizontal flip
    double brightness = 0, contrast = 0, saturation = 0;  // jitter strengths (0: off)
    double eval_crop = 0.875;  // eval: centre crop of this share of the short side
    std::uint64_t seed = 0;
  };
  explicit AugmentPolicy(Options options);

  AugmentParams draw(std::uint64_t index, std::uint32_t epoch, double aspect) const;

 private:
  Options o_;
};

/// Applies `params` to an RGB image and writes a size x size RGB view: crop, resize (area
/// interpolation when shrinking, bilinear when enlarging), flip, then brightness, contrast and
/// saturation in that fixed order.
void apply_augment(const Image& in, const AugmentParams& params, int size, Image& out);

/// RandomResizedCrop + flip + colour jitter for training, or resize + centre crop for
/// evaluation (mode: eval). The chosen parameters are stored in Sample::augment.
/// Normalisation (mean, std) happens in `collate`, fused with the copy into the batch tensor.
class AugmentStage final : public Map<Sample, Sample> {
 public:
  explicit AugmentStage(const Params& params);
  static StageDoc describe();

 protected:
  std::optional<Sample> process(Sample&& sample, ItemContext& ctx) override;

 private:
  AugmentPolicy policy_;
  int size_;
};

}  // namespace flowtrain::data
