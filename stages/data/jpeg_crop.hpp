#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "stages/data/augment.hpp"
#include "stages/data/sample.hpp"

namespace flowtrain::data {

/// The DCT scale, in eighths (1..8), at which a crop of `crop_width` x `crop_height` full-size
/// pixels is decoded: the smallest that keeps its shorter side at least `min_side` (8, full
/// size, when none does).
int crop_scale_eighths(int crop_width, int crop_height, int min_side);

/// Decodes only the part of a JPEG a crop needs (DALI's ROI decode, FFCV's crop decoder), with
/// the libjpeg API of libjpeg-turbo: the IDCT scales by M/8 (libjpeg-turbo offers every M from
/// 1 to 16), the smallest M that keeps the crop's shorter side at least `min_side`, so the DCT
/// does nearly all of the downscaling, with its own low-pass filter; `jpeg_crop_scanline` keeps
/// the MCU columns that hold the crop (no IDCT, upsampling or colour conversion for the others),
/// and `jpeg_skip_scanlines` passes over the rows above and below it. Entropy data is still decoded to the end of the image, so
/// corrupt or truncated data outside the crop is noticed as it is by a whole-image decode.
///
/// The decoder is strict and handles only the common case: baseline or progressive JPEGs in
/// YCbCr or grayscale, without any libjpeg warning. For anything else (another format, CMYK,
/// a warning, an error, a size above `max_pixels`) it returns false and the caller decodes the
/// whole image with `decode_image`, which also gives the exact reason for a refusal. One per
/// thread; reuses its buffers from image to image.
///
///   JpegCropDecoder decoder;
///   if (decoder.read_header(bytes, max_pixels)) {
///     const AugmentParams view = policy.draw(index, epoch, decoder.aspect());
///     if (decoder.decode(view, size, strip, crop)) resize(strip(crop), ...);
///   }
class JpegCropDecoder {
 public:
  JpegCropDecoder();
  ~JpegCropDecoder();
  JpegCropDecoder(const JpegCropDecoder&) = delete;
  JpegCropDecoder& operator=(const JpegCropDecoder&) = delete;

  /// Reads the JPEG header of `bytes` (which must outlive decode()). False if this decoder
  /// does not take the image (see the class comment).
  bool read_header(std::span<const std::uint8_t> bytes, std::int64_t max_pixels);

  /// Full-size width and height, after read_header.
  int width() const;
  int height() const;
  double aspect() const { return static_cast<double>(width()) / height(); }

  /// Decodes the rows of the crop of `view` and the MCU columns around it into `strip` (RGB,
  /// HWC), and sets `crop` to the crop's rectangle inside `strip`: `crop_rect(view, w, h)` for
  /// the image scaled by scale_eighths() / 8. False on any problem (then use decode_image).
  bool decode(const AugmentParams& view, int min_side, Image& strip, PixelRect& crop);

  /// The DCT scale of the last decode, in eighths: 1 to 8.
  int scale_eighths() const { return scale_eighths_; }

 private:
  struct State;
  std::unique_ptr<State> state_;
  int scale_eighths_ = 8;
};

}  // namespace flowtrain::data
