#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "graph/registry.hpp"
#include "stages/data/bad_sample_policy.hpp"
#include "stages/data/sample.hpp"

namespace flowtrain::data {

/// How `decode_image` decodes; the `jpeg_decode` stage's parameters of the same names.
struct DecodeOptions {
  /// Shorter side a JPEG must keep when decoded at a reduced DCT scale: the decoder picks the
  /// smallest of 1/8, 1/4, 1/2 and 1 that keeps it (like PIL's draft mode). 0: never scale.
  /// Other formats are always decoded at full size.
  int min_side = 0;
  /// Largest width x height accepted. Checked on the header, before any pixel buffer exists
  /// (for JPEG, PNG and BMP; other formats rely on OpenCV's own limit, 2^30 pixels).
  std::int64_t max_pixels = 100'000'000;
  /// Decode PNG, BMP, TIFF, WebP... through OpenCV; when false, only JPEG is accepted.
  bool other_formats = true;
  /// Largest file read (a path that leads to something endless must not eat the memory).
  std::int64_t max_file_bytes = std::int64_t{256} << 20;
};

/// Reads the whole file at `path` into `buffer`, which only grows, so a reused buffer is not
/// reallocated; `bytes` views what was read. Returns why it could not ("not a regular file (a
/// FIFO)", "larger than max_file_bytes 268435456", the system's reason), or an empty string.
/// Never blocks on a FIFO and never reads past `max_bytes`. The one file reader of the data path
/// (jpeg_decode, decode_crop, pack).
std::string read_file(const std::string& path,
                      std::vector<std::uint8_t>& buffer,
                      std::span<const std::uint8_t>& bytes,
                      std::int64_t max_bytes = DecodeOptions{}.max_file_bytes);

/// How a stage decodes its samples (jpeg_decode, decode_crop): decode_image's and read_file's
/// limits (DecodeOptions but min_side), and what becomes of a sample that fails (BadSamplePolicy).
struct SampleDecodeOptions {
  std::int64_t max_pixels = DecodeOptions{}.max_pixels;
  bool other_formats = DecodeOptions{}.other_formats;
  std::int64_t max_file_bytes = DecodeOptions{}.max_file_bytes;
  BadSampleOptions bad_samples;
  template <class Declare>
  void declare(Declare& d) {
    d(max_pixels, "max_pixels",
      "refuse images with more pixels than this, read from the header before any allocation",
      {.min = 1});
    d(other_formats, "other_formats",
      "also decode PNG, BMP, TIFF, WebP... through OpenCV; false: JPEG only");
    d(max_file_bytes, "max_file_bytes",
      "refuse files larger than this (read no further); FIFOs and devices are refused without "
      "reading",
      {.min = 1});
    bad_samples.declare(d);
  }

  /// The DecodeOptions these give (min_side 0).
  DecodeOptions decode_options() const;
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
/// writes it, else as is). EXIF orientation is not applied, as in PIL and torchvision.
///
/// Any libjpeg warning refuses the image (a corrupt scan mostly shows up only as "extraneous
/// bytes before marker 0xd9", and often not at all), except two about header fields that
/// libjpeg ignores before it reads any pixel data: an unknown JFIF revision and invalid SOS
/// parameters in a sequential JPEG. libjpeg reports only the first warning of a decode, so
/// corruption further on in such a file goes unnoticed.
DecodeResult decode_image(std::span<const std::uint8_t> bytes,
                          const DecodeOptions& options,
                          Image& out);

/// The params of the `jpeg_decode` stage.
struct JpegDecodeOptions {
  std::int64_t min_side = 0;
  SampleDecodeOptions decode;
  template <class Declare>
  void declare(Declare& d) {
    d(min_side, "min_side",
      "decode JPEGs at the smallest DCT scale (1/8, 1/4, 1/2) that keeps the shorter side >= "
      "this (before an eval crop: ceil(size / eval_crop), or the crop is upscaled); 0: full size",
      {.min = 0});
    decode.declare(d);
  }
};

/// Decodes `Sample::encoded` (or, when empty, the file at `Sample::path`) into `Sample::image`
/// and lets go of the encoded bytes. A sample that cannot be read or decoded is dropped or fails
/// the run as its BadSamplePolicy (`on_bad_sample`, `max_bad_fraction`) says.
class JpegDecodeStage final : public Map<Sample, Sample> {
 public:
  using Options = JpegDecodeOptions;
  /// `context`: the run's services; its process group (dist::World) if the run is a rank of
  /// a job.
  explicit JpegDecodeStage(const Options& options, const BuildContext& context = {});
  static StageDoc describe();
  /// "replaced": bad samples that stand-ins took the place of (on_bad_sample: replace).
  std::vector<StageResult> results() const override { return policy_.results(); }

  /// Samples processed so far, and how many of them were bad.
  std::uint64_t seen() const { return policy_.seen(); }
  std::uint64_t bad() const { return policy_.bad(); }

 protected:
  std::optional<Sample> process(Sample&& sample, ItemContext& ctx) override;

 private:
  DecodeOptions options_;
  BadSamplePolicy policy_;
  std::uint64_t recipe_;  // Sample::recipe of the images it decodes
};

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
