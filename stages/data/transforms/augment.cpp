#include "stages/data/transforms/augment.hpp"

#include <algorithm>
#include <cmath>
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>
#include <random>

#include "graph/error.hpp"
#include "stages/data/decode/opencv_threads.hpp"
#include "stages/data/splitmix.hpp"
#include "stages/data/transforms/recipe.hpp"

namespace flowtrain::data {

namespace {

void check_range(const std::vector<double>& range, const char* name, double lo) {
  if (range.size() != 2 || range[0] <= lo || range[0] > range[1]) {
    throw Error(std::string("param '") + name + "' must be [min, max] with " + std::to_string(lo) +
                " < min <= max");
  }
}

}  // namespace

AugmentPolicy::AugmentPolicy(Options options) : o_(std::move(options)) {
  check_range(o_.scale, "scale", 0);
  check_range(o_.ratio, "ratio", 0);
  if (o_.scale[1] > 1) throw Error("param 'scale' max must be <= 1");
  if (o_.eval_crop <= 0 || o_.eval_crop > 1) {
    throw Error("param 'eval_crop' must be in (0, 1]");
  }
}

int AugmentPolicy::eval_decode_side(int size) const {
  return static_cast<int>(std::ceil(size / o_.eval_crop - 1e-9));
}

AugmentParams AugmentPolicy::draw(std::uint64_t index, std::uint32_t epoch, double aspect) const {
  AugmentParams p;
  if (o_.mode == Mode::kEval) {
    // Resize the short side to size / eval_crop, then take the centre size x size square.
    const double side = o_.eval_crop;  // fraction of the short side
    p.crop_w = static_cast<float>(aspect >= 1 ? side / aspect : side);
    p.crop_h = static_cast<float>(aspect >= 1 ? side : side * aspect);
    p.crop_x = (1 - p.crop_w) / 2;
    p.crop_y = (1 - p.crop_h) / 2;
    return p;
  }
  std::mt19937_64 rng(splitmix64(o_.seed ^ splitmix64(view(index, epoch) ^ splitmix64(index))));
  std::uniform_real_distribution<double> unit(0, 1);
  auto uniform = [&](double lo, double hi) { return lo + (hi - lo) * unit(rng); };

  // RandomResizedCrop (as torchvision), in fractions of the image: an area share and an aspect
  // ratio, retried up to 10 times until the crop fits, else the largest centred crop.
  bool found = false;
  for (int attempt = 0; attempt < 10 && !found; ++attempt) {
    const double area = uniform(o_.scale[0], o_.scale[1]);
    const double r = std::exp(uniform(std::log(o_.ratio[0]), std::log(o_.ratio[1])));
    const double w = std::sqrt(area * r / aspect);
    const double h = std::sqrt(area * aspect / r);
    if (w <= 1 && h <= 1) {
      p.crop_w = static_cast<float>(w);
      p.crop_h = static_cast<float>(h);
      p.crop_x = static_cast<float>(uniform(0, 1 - w));
      p.crop_y = static_cast<float>(uniform(0, 1 - h));
      found = true;
    }
  }
  if (!found) {
    const double r = std::clamp(aspect, o_.ratio[0], o_.ratio[1]);
    p.crop_w = static_cast<float>(std::min(1.0, r / aspect));
    p.crop_h = static_cast<float>(std::min(1.0, aspect / r));
    p.crop_x = (1 - p.crop_w) / 2;
    p.crop_y = (1 - p.crop_h) / 2;
  }
  p.flip = unit(rng) < o_.flip;
  auto jitter = [&](double strength) {
    return strength > 0 ? static_cast<float>(uniform(std::max(0.0, 1 - strength), 1 + strength))
                        : 1.0f;
  };
  p.brightness = jitter(o_.brightness);
  p.contrast = jitter(o_.contrast);
  p.saturation = jitter(o_.saturation);
  return p;
}

std::uint32_t AugmentPolicy::view(std::uint64_t index, std::uint32_t epoch) const {
  if (o_.views_per_image == 0) return epoch;
  const std::uint64_t offset = splitmix64(~o_.seed ^ splitmix64(index));
  return static_cast<std::uint32_t>((epoch + offset % o_.views_per_image) % o_.views_per_image);
}

PixelRect crop_rect(const AugmentParams& p, int width, int height) {
  PixelRect r;
  r.x = std::clamp(static_cast<int>(std::lround(p.crop_x * width)), 0, width - 1);
  r.y = std::clamp(static_cast<int>(std::lround(p.crop_y * height)), 0, height - 1);
  r.width = std::clamp(static_cast<int>(std::lround(p.crop_w * width)), 1, width - r.x);
  r.height = std::clamp(static_cast<int>(std::lround(p.crop_h * height)), 1, height - r.y);
  return r;
}

void apply_augment(const Image& in, const AugmentParams& p, int size, Image& out) {
  render_view(in, crop_rect(p, in.width, in.height), p, size, out);
}

ContrastMap contrast_map(const AugmentParams& p, const double channel_mean[3]) {
  const double grey =
      (0.299 * channel_mean[0] + 0.587 * channel_mean[1] + 0.114 * channel_mean[2]) *
      p.brightness;
  return {p.contrast * p.brightness, (1 - p.contrast) * grey};
}

void resize_view(const Image& in, const PixelRect& crop, int size, Image& out, Resample resample) {
  if (in.channels != 3) throw Error("augment expects RGB images (3 channels)");
  const cv::Mat src(in.height, in.width, CV_8UC3, const_cast<std::uint8_t*>(in.pixels.data()));
  out.width = out.height = size;
  out.channels = 3;
  out.pixels.resize(static_cast<std::size_t>(size) * size * 3);
  cv::Mat dst(size, size, CV_8UC3, out.pixels.data());
  const bool area = resample == Resample::kAreaWhenShrinking
                        ? crop.width > size || crop.height > size
                        : std::min(crop.width, crop.height) >= 2 * size;
  cv::resize(src(cv::Rect(crop.x, crop.y, crop.width, crop.height)), dst, dst.size(), 0, 0,
             area ? cv::INTER_AREA : cv::INTER_LINEAR);
}

void render_view(const Image& in,
                 const PixelRect& crop,
                 const AugmentParams& p,
                 int size,
                 Image& out,
                 Resample resample) {
  resize_view(in, crop, size, out, resample);
  cv::Mat dst(size, size, CV_8UC3, out.pixels.data());
  if (p.flip) cv::flip(dst, dst, 1);

  if (p.brightness != 1 || p.contrast != 1) {
    const cv::Scalar mean = cv::mean(dst);
    const ContrastMap map = contrast_map(p, mean.val);
    dst.convertTo(dst, -1, map.alpha, map.beta);
  }
  if (p.saturation != 1) {
    // Blend with the grey image: out = s * rgb + (1 - s) * grey, with OpenCV's SIMD kernels.
    thread_local cv::Mat grey, grey_rgb;
    cv::cvtColor(dst, grey, cv::COLOR_RGB2GRAY);
    cv::cvtColor(grey, grey_rgb, cv::COLOR_GRAY2RGB);
    cv::addWeighted(dst, p.saturation, grey_rgb, 1.0 - p.saturation, 0, dst);
  }
}

AugmentPolicy::Options AugmentOptions::policy() const {
  AugmentPolicy::Options o;
  o.mode = mode;
  o.scale = scale;
  o.ratio = ratio;
  o.flip = flip;
  o.brightness = brightness;
  o.contrast = contrast;
  o.saturation = saturation;
  o.eval_crop = eval_crop;
  o.seed = static_cast<std::uint64_t>(seed);
  o.views_per_image = static_cast<std::uint32_t>(views_per_image);
  return o;
}

std::uint64_t AugmentOptions::recipe(std::uint64_t into) const {
  return mix_recipe(into, "augment", to_params(*this), {"seed", "views_per_image"});
}

AugmentStage::AugmentStage(const Options& options)
    : policy_(options.policy()),
      size_(static_cast<int>(options.size)),
      recipe_(options.recipe(0)) {
  keep_opencv_on_caller_thread();
}

StageDoc AugmentStage::describe() {
  return {
      "Random resized crop, flip and colour jitter (train), or resize + centre crop (eval); "
      "parameters derive from (seed, epoch, sample index) only.",
      option_specs<Options>()};
}

std::optional<Sample> AugmentStage::process(Sample&& sample, ItemContext& /*ctx*/) {
  if (sample.image.empty()) {
    throw Error(sample.path + ": no decoded image; put jpeg_decode before augment");
  }
  const double aspect = static_cast<double>(sample.image.width) / sample.image.height;
  sample.augment = policy_.draw(sample.index, sample.epoch, aspect);
  sample.recipe = recipe_ ^ splitmix64(sample.recipe);
  Image view;
  apply_augment(sample.image, sample.augment, size_, view);
  sample.image = std::move(view);
  return std::move(sample);
}

FLOWTRAIN_REGISTER_STAGE("augment", AugmentStage);

}  // namespace flowtrain::data
