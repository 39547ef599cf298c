// Image decode: the whole-image decoder (JPEG through TurboJPEG, other formats through OpenCV)
// must never throw; the crop decoder must refuse or decode any view of any input.
#include <cstdlib>
#include <span>

#include "stages/data/decode/image_decode.hpp"
#include "stages/data/decode/jpeg_crop.hpp"
#include "tests/fuzz/fuzz_target.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace flowtrain::data;
  const std::span<const std::uint8_t> bytes(data, size);
  static constexpr std::int64_t kMaxPixels = 4'000'000;  // keep one run short
  Image image;
  // The last byte picks the DCT scale, so scaled decodes are fuzzed too.
  const int min_side = size > 0 ? data[size - 1] % 4 * 40 : 0;
  const DecodeResult whole = decode_image(bytes, {.min_side = min_side, .max_pixels = kMaxPixels}, image);
  if (whole.ok() && (image.channels != 3 || image.pixels.size() !=
                                                  static_cast<std::size_t>(image.width) *
                                                      static_cast<std::size_t>(image.height) * 3)) {
    std::abort();  // a decode that says yes must fill its image
  }
  static JpegCropDecoder crop_decoder;
  if (crop_decoder.read_header(bytes, kMaxPixels)) {
    const AugmentParams view{.crop_x = 0.25f, .crop_y = 0.1f, .crop_w = 0.5f, .crop_h = 0.7f};
    Image strip;
    PixelRect crop;
    if (crop_decoder.decode(view, 16, strip, crop) &&
        (crop.x < 0 || crop.y < 0 || crop.x + crop.width > strip.width ||
         crop.y + crop.height > strip.height)) {
      std::abort();  // the crop must lie inside what was decoded
    }
  }
  return 0;
}
