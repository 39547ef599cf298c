#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "stages/data/augment.hpp"
#include "stages/data/sample.hpp"

namespace flowtrain::data {

/// Decodes only the part of a JPEG a crop needs (DALI's ROI decode, FFCV's crop decoder), with
/// the libjpeg API of libjpeg-turbo: the DCT scale is the smallest of 1/8, 1/4, 1/2 and 1 that
/// keeps the crop's shorter side at least `min_side` (dct_scale_denom of the crop), so the DCT
/// does most of the downscaling and what is left to resample is under 2x; `jpeg_crop_scanline`
/// keeps the MCU columns that hold the crop (no IDCT, upsampling or colour conversion for the
/// others), and `jpeg_skip_scanlines` passes over the rows above and below it. (libjpeg-turbo
/// also scales by any M/8, but its IDCTs for other M are plain C: measured slower overall, and
/// further from the whole-image path's pixels.) With `ReadTo::kImageEnd` entropy data is still
/// decoded to the end of the image, so corrupt or truncated data outside the crop is noticed as
/// it is by a whole-image decode; with `ReadTo::kCropEnd` the decode stops after the crop's
/// last row (the same pixels; the rest of the file unread, so unchecked).
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

  /// How far a decode reads the entropy-coded data: to the end of the image (damage anywhere
  /// refuses it), or only to the crop's last row (the rows below are neither decoded nor checked).
  enum class ReadTo { kImageEnd, kCropEnd };

  /// Decodes the rows of the crop of `view` and the MCU columns around it into `strip` (RGB,
  /// HWC), and sets `crop` to the crop's rectangle inside `strip`: `crop_rect(view, w, h)` for
  /// the image scaled by 1 / scale_denom(). False on any problem (then use decode_image).
  bool decode(const AugmentParams& view,
              int min_side,
              Image& strip,
              PixelRect& crop,
              ReadTo read_to = ReadTo::kImageEnd);

  /// The DCT scale denominator of the last decode: 1, 2, 4 or 8.
  int scale_denom() const { return scale_denom_; }

 private:
  struct State;
  std::unique_ptr<State> state_;
  int scale_denom_ = 1;
};

}  // namespace flowtrain::data
