#pragma once

#include <cstdint>
#include <optional>
#include <span>
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
    /// > 0: each image has this many fixed views, and epoch e shows view (e + offset) % K, the
    /// offset drawn per image: every view once in K epochs, then again (FKD's fixed views).
    std::uint32_t views_per_image = 0;
  };
  explicit AugmentPolicy(Options options);

  AugmentParams draw(std::uint64_t index, std::uint32_t epoch, double aspect) const;
  /// The view of sample `index` that epoch `epoch` shows: the epoch itself, or with
  /// views_per_image K, one of 0..K-1.
  std::uint32_t view(std::uint64_t index, std::uint32_t epoch) const;
  /// The shorter side an image needs for an eval view of side `size` to be a downscale:
  /// ceil(size / eval_crop) (a DCT-scaled decode should keep at least this).
  int eval_decode_side(int size) const;

 private:
  Options o_;
};

/// A config's names of the modes (param mode): train, eval.
inline std::span<const EnumName<AugmentPolicy::Mode>> enum_names(AugmentPolicy::Mode) {
  static constexpr EnumName<AugmentPolicy::Mode> names[] = {{AugmentPolicy::Mode::kTrain, "train"},
                                                            {AugmentPolicy::Mode::kEval, "eval"}};
  return names;
}

/// The params of an AugmentPolicy and the view size, for the stages that draw views (augment,
/// decode_crop).
struct AugmentOptions {
  AugmentPolicy::Mode mode = AugmentPolicy::Mode::kTrain;
  std::int64_t size = 224;
  std::vector<double> scale = {0.08, 1.0};
  std::vector<double> ratio = {3.0 / 4, 4.0 / 3};
  double flip = 0.5;
  double brightness = 0;
  double contrast = 0;
  double saturation = 0;
  double eval_crop = 0.875;
  std::int64_t seed = 0;
  std::int64_t views_per_image = 0;
  template <class Declare>
  void declare(Declare& d) {
    d(mode, "mode", "train: random views; eval: deterministic centre crop");
    d(size, "size", "output side in pixels (square)", {.min = 1, .max = 8192});
    d(scale, "scale", "train: crop area range, fraction of image");
    d(ratio, "ratio", "train: crop aspect ratio range");
    d(flip, "flip", "train: probability of a horizontal flip", {.min = 0});
    d(brightness, "brightness", "train: brightness jitter strength (0: off)", {.min = 0});
    d(contrast, "contrast", "train: contrast jitter strength (0: off)", {.min = 0});
    d(saturation, "saturation", "train: saturation jitter strength (0: off)", {.min = 0});
    d(eval_crop, "eval_crop", "eval: centre crop share of the short side", {.min = 0});
    d(seed, "seed", "seed of the per-sample random parameters", {.min = 0});
    d(views_per_image, "views_per_image",
      "train: K > 0 gives each image K fixed views, every one shown once in K epochs, then "
      "again (FKD), so a teacher_cache needs the teacher only for K epochs; 0: a fresh view "
      "every epoch",
      {.min = 0, .max = 1 << 20});
  }

  /// The policy's options (all but `size`).
  AugmentPolicy::Options policy() const;
  /// mix_recipe of the params that shape a view's pixels (all but seed and views_per_image,
  /// which only choose the view: the view key holds its parameters).
  std::uint64_t recipe(std::uint64_t into) const;
};

/// A rectangle of pixels.
struct PixelRect {
  int x = 0;
  int y = 0;
  int width = 0;
  int height = 0;

  bool operator==(const PixelRect&) const = default;
};

/// The pixel rectangle `params` crops from a `width` x `height` image: its fractions rounded to
/// whole pixels, at least one pixel, inside the image.
PixelRect crop_rect(const AugmentParams& params, int width, int height);

/// How render_view resamples a crop to the output size.
enum class Resample {
  /// Area interpolation whenever it shrinks, bilinear when it enlarges (`augment`).
  kAreaWhenShrinking,
  /// Area interpolation only when both sides shrink by 2 or more, else bilinear: for a crop
  /// the DCT already scaled so that its shorter side is less than twice the size (`decode_crop`;
  /// the longer side, at most 4/3 of it, shrinks by less than 2.7). OpenCV's area resize by a
  /// fraction costs 5-7x its bilinear one.
  kAreaFrom2x,
};

/// Brightness and contrast as render_view applies them, one linear map of every channel value:
/// v -> alpha * v + beta, where contrast blends with the mean grey level of the brightened view.
struct ContrastMap {
  double alpha = 1;
  double beta = 0;
};

/// The map of `params`, given the mean of each channel (R, G, B) of the resized view.
ContrastMap contrast_map(const AugmentParams& params, const double channel_mean[3]);

/// Resizes the rectangle `crop` of an RGB image to a size x size RGB image: render_view's first
/// step.
void resize_view(const Image& in,
                 const PixelRect& crop,
                 int size,
                 Image& out,
                 Resample resample = Resample::kAreaWhenShrinking);

/// Renders the view `params` describes from the rectangle `crop` of an RGB image into a size x
/// size RGB image: resize, flip, then brightness, contrast and saturation in that fixed order.
void render_view(const Image& in,
                 const PixelRect& crop,
                 const AugmentParams& params,
                 int size,
                 Image& out,
                 Resample resample = Resample::kAreaWhenShrinking);

/// Applies `params` to a whole RGB image: render_view of its crop_rect.
void apply_augment(const Image& in, const AugmentParams& params, int size, Image& out);

/// RandomResizedCrop + flip + colour jitter for training, or resize + centre crop for
/// evaluation (mode: eval). The chosen parameters are stored in Sample::augment.
/// Normalisation (mean, std) happens in `collate`, fused with the copy into the batch tensor.
class AugmentStage final : public Map<Sample, Sample> {
 public:
  using Options = AugmentOptions;
  explicit AugmentStage(const Options& options);
  /// Throws Error on params the constructor would refuse (a scale that is not [min, max]).
  static void check(const Options& options) { AugmentPolicy{options.policy()}; }
  static StageDoc describe();

 protected:
  std::optional<Sample> process(Sample&& sample, ItemContext& ctx) override;

 private:
  AugmentPolicy policy_;
  int size_;
  std::uint64_t recipe_;
};

}  // namespace flowtrain::data
