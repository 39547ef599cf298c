#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "stages/data/sample.hpp"
#include "stages/data/transforms/augment.hpp"

namespace flowtrain::data {

class McuIndexedJpeg;

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
/// A JPEG file indexed by JpegCropDecoder::index() (see there) can then be decoded view by view
/// with decode(file, ...), which entropy-decodes only the crop's MCUs.
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

  /// Re-encodes the image whose header was just read into a McuIndexedJpeg (instead of a
  /// decode() of these bytes), or returns null for an image decode() would refuse: all of its
  /// entropy data is decoded, so damage anywhere refuses it.
  std::unique_ptr<const McuIndexedJpeg> index();

  /// decode() of a view of an indexed file: the crop's pixels are those of decode() of the
  /// original bytes, bit for bit, but only the crop's MCUs (and, where upsampling at this scale
  /// reads across MCU rows, the MCU row above and below) are decoded.
  bool decode(const McuIndexedJpeg& file,
              const AugmentParams& view,
              int min_side,
              Image& strip,
              PixelRect& crop);

  /// The DCT scale denominator of the last decode: 1, 2, 4 or 8.
  int scale_denom() const { return scale_denom_; }

 private:
  struct State;
  /// Sets scale_denom_ for `view` of a `width` x `height` image and returns its crop in the
  /// pixels of the image scaled by it (libjpeg's output size).
  PixelRect scaled_crop(const AugmentParams& view, int width, int height, int min_side);
  /// Starts the decode of the header just read at `scale_denom_` and reads the rows of `crop`
  /// (in output pixels) and the MCU columns around it into `strip`; `crop` becomes the crop's
  /// rectangle inside `strip`. Called under the caller's setjmp.
  void read_crop(Image& strip, PixelRect& crop);

  std::unique_ptr<State> state_;
  int scale_denom_ = 1;
};

/// A JPEG re-encoded losslessly (jpegtran's transcode: the same DCT coefficients, quantisation
/// and sampling, as a baseline JPEG with Huffman tables of its own) with a restart marker after
/// every MCU, and where each MCU's entropy-coded data begins. A restart resets the DC
/// predictions, so each MCU's data decodes on its own, and any rectangle of MCUs is a JPEG of
/// its own: the headers with that width and height, then the MCUs' data in order, renumbered
/// markers between them. Each of its pixels is the original's (within one MCU of the rectangle's
/// edges only where upsampling reads across MCUs; JpegCropDecoder adds those rows). About the
/// size of the original file: 2-3 bytes more per MCU (16x16 pixels for 4:2:0).
///
/// The entropy decoding of later views is then proportional to their crop's area, not to the
/// image's rows down to the crop's last (libjpeg can only skip rows by decoding them).
class McuIndexedJpeg {
 public:
  int width() const { return width_; }
  int height() const { return height_; }
  /// Memory held, in bytes.
  std::size_t bytes() const { return data_.capacity() + mcu_begin_.capacity() * 4; }

  /// Writes the JPEG of MCU columns [c0, c1) and rows [r0, r1) into `out` (resized to fit).
  void write_region(int c0, int c1, int r0, int r1, std::vector<std::uint8_t>& out) const;

 private:
  friend class JpegCropDecoder;
  std::vector<std::uint8_t> data_;       // the re-encoded file
  std::size_t sof_ = 0;                  // offset of the SOF marker (its size fields follow)
  std::size_t scan_begin_ = 0;           // offset of the first MCU's data
  std::size_t scan_end_ = 0;             // offset of the EOI marker
  std::vector<std::uint32_t> mcu_begin_;  // offset of each MCU's data, row by row
  int width_ = 0, height_ = 0;
  int mcu_width_ = 8, mcu_height_ = 8;  // in full-size pixels
  int mcus_x_ = 0, mcus_y_ = 0;
  /// Per DCT scale 1, 1/2, 1/4, 1/8: whether upsampling reads across MCU rows (the chroma of
  /// a vertically subsampled image, where the DCT does not scale it up to the output's size).
  std::array<bool, 4> reads_rows_across_{};
};

}  // namespace flowtrain::data
