// render_view_normalized: the fused pass gives exactly the floats of render_view + Normalizer.
#include <doctest/doctest.h>

#include <cstring>
#include <random>
#include <vector>

#include "stages/data/sources/synthetic.hpp"
#include "stages/data/transforms/augment.hpp"
#include "stages/data/transforms/normalizer.hpp"
#include "stages/data/transforms/render_normalized.hpp"

using namespace flowtrain::data;

namespace {

/// Noise, so that rounding meets every pixel value and every jitter result.
Image noise(int width, int height, std::uint32_t seed) {
  Image image;
  image.width = width;
  image.height = height;
  image.channels = 3;
  image.pixels.resize(static_cast<std::size_t>(width) * height * 3);
  std::mt19937 rng(seed);
  for (auto& p : image.pixels) p = static_cast<std::uint8_t>(rng());
  return image;
}

/// How many of the floats differ (bit for bit) between the two ways, for one view.
std::size_t differing(const Image& in,
                      const AugmentParams& p,
                      int size,
                      Resample resample,
                      const Normalizer& normalize) {
  const PixelRect crop = crop_rect(p, in.width, in.height);
  const std::size_t n = 3 * static_cast<std::size_t>(size) * size;
  std::vector<float> expected(n), fused(n, -1000.0f);
  Image view, scratch;
  render_view(in, crop, p, size, view, resample);
  normalize(view, expected.data());
  render_view_normalized(in, crop, p, size, resample, normalize, scratch, fused.data());
  std::size_t count = 0;
  for (std::size_t i = 0; i < n; ++i) count += std::memcmp(&expected[i], &fused[i], 4) != 0;
  return count;
}

}  // namespace

TEST_CASE("Data.RenderNormalized.BitIdenticalToRenderViewThenNormalizer") {
  if (!fused_render_available()) MESSAGE("no AVX2 and FMA here: the fused pass is not used");
  AugmentPolicy::Options options;
  options.brightness = options.contrast = options.saturation = 0.5;
  const AugmentPolicy policy(options);
  const Normalizer normalize({0.485, 0.456, 0.406}, {0.229, 0.224, 0.225});
  const std::vector<Image> images = {
      noise(307, 173, 1), noise(41, 29, 2),
      render_synthetic_image(2, 4, 640, 360, 7, 3), render_synthetic_image(1, 4, 173, 307, 7, 4)};
  std::size_t views = 0, flipped = 0;
  for (const int size : {8, 13, 64, 96, 97, 112, 224}) {
    for (std::size_t i = 0; i < images.size(); ++i) {
      const Image& image = images[i];
      for (std::uint64_t index = 0; index < 6; ++index) {
        AugmentParams p =
            policy.draw(index + 10 * i, static_cast<std::uint32_t>(size), 1.0 * image.width /
                                                                             image.height);
        // Each of the pass's four shapes: with and without the linear map and the saturation.
        if (index % 4 == 1) p.brightness = p.contrast = 1;
        if (index % 4 == 2) p.saturation = 1;
        if (index % 4 == 3) p.brightness = p.contrast = p.saturation = 1;
        for (const Resample resample : {Resample::kAreaWhenShrinking, Resample::kAreaFrom2x}) {
          CAPTURE(size);
          CAPTURE(i);
          CAPTURE(index);
          CHECK(differing(image, p, size, resample, normalize) == 0);
          ++views;
          flipped += p.flip;
        }
      }
    }
  }
  CHECK(views == 336);
  CHECK(flipped > 0);
  CHECK(flipped < views);
}

TEST_CASE("Data.RenderNormalized.ClampedAtBothEnds") {
  // Jitter far outside any policy's range, so that most levels saturate at 0 or 255 on the way.
  const Image image = noise(64, 48, 6);
  const Normalizer normalize({0.5, 0.5, 0.5}, {0.25, 0.25, 0.25});
  for (const float factor : {0.0f, 0.05f, 2.5f, 4.0f}) {
    AugmentParams p;
    p.brightness = factor;
    p.contrast = 4.0f - factor;
    p.saturation = factor;
    p.flip = factor > 1;
    CAPTURE(factor);
    CHECK(differing(image, p, 40, Resample::kAreaWhenShrinking, normalize) == 0);
  }
}
