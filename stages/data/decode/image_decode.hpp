#pragma once

// Decoding an image's bytes into RGB pixels, and reading them from a file: pure, thread-safe
// functions with no LibTorch in them (the decoding stages, packing, predict and the fuzz targets
// share them). The stages around them add the bad-sample policy (stages/data/decode/jpeg_decode.hpp).

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "graph/read_file.hpp"
#include "stages/data/sample.hpp"

namespace flowtrain::data {

/// How `decode_image` decodes; the `jpeg_decode` stage's parameters of the same names.
struct DecodeOptions {
  /// Shorter side a JPEG must keep when decoded at a reduced DCT scale: the decoder picks the
  /// smallest of 1/8, 1/4, 1/2 and 1 that keeps it (like PIL's draft mode). 0: never scale.
  /// Other formats are always decoded at full size.
  int min_side = 0;
  /// Largest width x height accepted. Checked on the header, before any pixel buffer exists, for
  /// every format (stages/data/decode/image_header.hpp reads the size of those OpenCV decodes).
  std::int64_t max_pixels = 100'000'000;
  /// Decode PNG, BMP, TIFF, WebP... through OpenCV; when false, only JPEG is accepted.
  bool other_formats = true;
  /// Largest file read (a path that leads to something endless must not eat the memory).
  std::int64_t max_file_bytes = kMaxFileBytes;
};

/// What `decode_image` did.
struct DecodeResult {
  /// Why the data was refused ("truncated JPEG data", ...); empty on success.
  std::string error;
  /// The JPEG was decoded at 1/scale_denom of its size: 1, 2, 4 or 8 (always 1 for others).
  int scale_denom = 1;

  bool ok() const { return error.empty(); }
};

/// The DCT scale denominator (1, 2, 4 or 8) used for a `width` x `height` JPEG: the largest
/// whose scaled shorter side, rounded up as libjpeg does, is still >= `min_side` (1 if
/// `min_side` <= 0 or no reduction keeps it).
int dct_scale_denom(int width, int height, int min_side);

/// Decodes an encoded image into `out` as 8-bit RGB, HWC, 3 channels, reusing the capacity of
/// `out.pixels`. Thread-safe (one TurboJPEG handle per thread), and never throws on bad data:
/// a refusal is returned as `error` with `out` left empty.
///
/// JPEG goes through TurboJPEG with DCT-domain scaling (`min_side`); grayscale becomes RGB and
/// CMYK/YCCK is converted (stored inverted when the file has an Adobe marker, as Photoshop
/// writes it, else as is). EXIF orientation is not applied, as in PIL and torchvision. Other
/// formats go to OpenCV only when their signature says PNG, BMP, TIFF, WebP, JPEG 2000, PNM,
/// HDR, OpenEXR or Sun raster (GIF is named but OpenCV cannot decode it); anything else is
/// "not an image (unknown format)": OpenCV would try every decoder it has on it, and some abort
/// the process on damaged data. Their size is read from their header first (`read_image_size`);
/// one that declares none is refused ("cannot decode TIFF data (no image size in its header)").
/// A build without OpenCV's imgcodecs (FLOWTRAIN_IMAGE_CODECS=OFF, or not found) decodes JPEGs
/// only and refuses the others ("cannot decode PNG data: this build has no OpenCV image codecs
/// (JPEG only)").
///
/// Any libjpeg warning refuses the image (a corrupt scan mostly shows up only as "extraneous
/// bytes before marker 0xd9", and often not at all), except two about header fields that
/// libjpeg ignores before it reads any pixel data: an unknown JFIF revision and invalid SOS
/// parameters in a sequential JPEG. libjpeg reports only the first warning of a decode, so
/// corruption further on in such a file goes unnoticed.
DecodeResult decode_image(std::span<const std::uint8_t> bytes,
                          const DecodeOptions& options,
                          Image& out);

/// OpenCV 4.6's imdecode prints a failing decoder's exception to std::cerr itself
/// ("imdecode_(''): can't read data: ..."), and its logger prints some decoders' complaints there
/// ("[ERROR:0@0.1] ... OpenJPEG2000: ..."): raw lines about a file whose reason the stage reports
/// anyway. This puts a filter on std::cerr, process-wide and once, that drops what a thread writes
/// there while decode_image has it inside imdecode, and passes on every other write unchanged.
/// decode_image calls it; the stages call it when built, before their threads run, as replacing
/// std::cerr's buffer while another thread writes to it would race. What libpng or libtiff print
/// with fprintf ("libpng error: ...") does not go through std::cerr and still shows.
void quiet_opencv_decode_errors();

/// Thread buffers above this size are released after use instead of kept for the next sample.
inline constexpr std::size_t kKeepScratchBytes = std::size_t{64} << 20;

/// The encoded bytes of `sample`: Sample::encoded, or else the file at Sample::path read into
/// this thread's file buffer (reused from sample to sample; valid until release_encoded).
/// Returns why they could not be had, or an empty string. For the stages that decode.
std::string sample_bytes(const Sample& sample,
                         std::span<const std::uint8_t>& bytes,
                         std::int64_t max_file_bytes);

/// Lets go of `sample`'s encoded bytes once decoded (downstream stages need the pixels only),
/// and of this thread's decode buffers that grew past kKeepScratchBytes.
void release_encoded(Sample& sample);

}  // namespace flowtrain::data
