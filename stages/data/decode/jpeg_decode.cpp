#include "stages/data/decode/jpeg_decode.hpp"

#include <algorithm>
#include <climits>
#include <utility>

#include "stages/data/decode/opencv_threads.hpp"
#include "stages/data/transforms/recipe.hpp"

namespace flowtrain::data {

DecodeOptions SampleDecodeOptions::decode_options() const {
  DecodeOptions options;
  options.max_pixels = max_pixels;
  options.other_formats = other_formats;
  options.max_file_bytes = max_file_bytes;
  return options;
}

JpegDecodeStage::JpegDecodeStage(const Options& options, const BuildContext& context)
    : options_(options.decode.decode_options()),
      policy_(options.decode.bad_samples, job_placement(context)),
      recipe_(mix_recipe(0, "jpeg_decode", Params({{"min_side", options.min_side}}))) {
  options_.min_side = static_cast<int>(std::clamp<std::int64_t>(options.min_side, 0, INT_MAX));
  keep_opencv_on_caller_thread();  // other formats decode through OpenCV
  quiet_opencv_decode_errors();    // before the workers run
}

StageDoc JpegDecodeStage::describe() {
  return {
      "Decodes images into RGB: JPEG with TurboJPEG (optionally downscaled in the DCT domain), "
      "other formats with OpenCV. Unreadable or corrupt files are dropped with the reason.",
      option_specs<Options>()};
}

std::optional<Sample> JpegDecodeStage::process(Sample&& sample, ItemContext& ctx) {
  const bool decoded = policy_.decode(sample, ctx, [this](Sample& s) {
    std::span<const std::uint8_t> bytes;
    std::string error = sample_bytes(s, bytes, options_.max_file_bytes);
    if (error.empty()) error = decode_image(bytes, options_, s.image).error;
    release_encoded(s);
    return error;
  });
  if (!decoded) return std::nullopt;
  sample.recipe = recipe_;  // decoding starts a sample's pixels
  return std::move(sample);
}

FLOWTRAIN_REGISTER_STAGE("jpeg_decode", JpegDecodeStage);

}  // namespace flowtrain::data
