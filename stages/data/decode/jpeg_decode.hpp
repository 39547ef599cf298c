#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "graph/registry.hpp"
#include "stages/data/decode/bad_sample_policy.hpp"
#include "stages/data/decode/image_decode.hpp"
#include "stages/data/sample.hpp"

namespace flowtrain::data {

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

}  // namespace flowtrain::data
