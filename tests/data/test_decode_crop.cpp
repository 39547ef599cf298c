// decode_crop and assemble_batch: the crop-only JPEG decoder against the whole-image path, bad
// data inside and outside the crop, batches independent of concurrency, drops, and the batches
// the old path (jpeg_decode -> augment -> collate) gives.
#include <ATen/ATen.h>
#include <doctest/doctest.h>
#include <turbojpeg.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "graph/config.hpp"
#include "graph/error.hpp"
#include "graph/pipeline.hpp"
#include "graph/registry.hpp"
#include "stages/data/batching/assemble_batch.hpp"
#include "stages/data/decode/decode_crop.hpp"
#include "stages/data/decode/jpeg_crop.hpp"
#include "stages/data/decode/jpeg_decode.hpp"
#include "stages/data/sources/synthetic.hpp"
#include "stages/data/transforms/augment.hpp"
#include "tests/data/declared_size.hpp"
#include "tests/stage_result.hpp"
#include "tests/temp_dir.hpp"
#include "tests/test_stages.hpp"

using namespace flowtrain;
using namespace flowtrain::data;

namespace {

using Bytes = std::vector<std::uint8_t>;

Bytes photo(int width, int height, std::uint64_t index, int quality = 90) {
  return encode_jpeg(
      render_synthetic_image(static_cast<std::int64_t>(index % 4), 4, width, height, 7, index),
      quality);
}

AugmentPolicy train_policy(std::uint64_t seed) {
  AugmentPolicy::Options o;
  o.seed = seed;
  o.brightness = o.contrast = o.saturation = 0.3;
  return AugmentPolicy(o);
}

/// The view through the old path: whole image at full size, then augment's rendering.
Image old_view(const Bytes& bytes, const AugmentParams& view, int size) {
  Image whole, out;
  REQUIRE(decode_image(bytes, {}, whole).ok());
  apply_augment(whole, view, size, out);
  return out;
}

/// The view through the crop decoder, as decode_crop renders it; empty if the decoder refused.
Image crop_view(const Bytes& bytes,
                const AugmentParams& view,
                int size,
                JpegCropDecoder::ReadTo read_to = JpegCropDecoder::ReadTo::kImageEnd) {
  JpegCropDecoder decoder;
  Image strip, out;
  PixelRect crop;
  if (!decoder.read_header(bytes, 100'000'000) ||
      !decoder.decode(view, size, strip, crop, read_to)) {
    return out;
  }
  render_view(strip, crop, view, size, out, Resample::kAreaFrom2x);
  return out;
}

double mean_abs_diff(const Image& a, const Image& b) {
  REQUIRE(a.pixels.size() == b.pixels.size());
  double sum = 0;
  for (std::size_t i = 0; i < a.pixels.size(); ++i) sum += std::abs(a.pixels[i] - b.pixels[i]);
  return sum / static_cast<double>(a.pixels.size());
}

/// `jpeg` with two bytes of an unexpected marker (RST5) put `fraction` of the way into its scan.
Bytes with_marker_in_scan(const Bytes& jpeg, double fraction) {
  std::size_t sos = 2;
  while (!(jpeg[sos] == 0xFF && jpeg[sos + 1] == 0xDA))
    sos += 2 + (jpeg[sos + 2] << 8 | jpeg[sos + 3]);
  const std::size_t begin = sos + 2 + (jpeg[sos + 2] << 8 | jpeg[sos + 3]);
  const std::size_t end = jpeg.size() - 2;
  auto at = begin + static_cast<std::size_t>(fraction * static_cast<double>(end - begin));
  if (jpeg[at - 1] == 0xFF) ++at;  // not inside a stuffed 0xFF 0x00
  Bytes out(jpeg.begin(), jpeg.begin() + static_cast<std::ptrdiff_t>(at));
  out.push_back(0xFF);
  out.push_back(0xD5);
  out.insert(out.end(), jpeg.begin() + static_cast<std::ptrdiff_t>(at), jpeg.end());
  return out;
}

/// `rgb` as a JPEG with the given TurboJPEG subsampling, baseline or progressive.
Bytes encode_with(const Image& rgb, int subsampling, bool progressive) {
  tjhandle handle = tjInitCompress();
  unsigned char* out = nullptr;
  unsigned long size = 0;
  REQUIRE(tjCompress2(handle, rgb.pixels.data(), rgb.width, 0, rgb.height, TJPF_RGB, &out, &size,
                      subsampling, 88, progressive ? TJFLAG_PROGRESSIVE : 0) == 0);
  Bytes bytes(out, out + size);
  tjFree(out);
  tjDestroy(handle);
  return bytes;
}

/// The pixels of the crop of `view` in a strip the crop decoder wrote.
Bytes crop_pixels(const Image& strip, const PixelRect& crop) {
  Bytes out;
  for (int y = crop.y; y < crop.y + crop.height; ++y) {
    const std::uint8_t* row = strip.pixels.data() + (std::size_t(y) * strip.width + crop.x) * 3;
    out.insert(out.end(), row, row + std::size_t(crop.width) * 3);
  }
  return out;
}

AugmentParams region(float x, float y, float w, float h) {
  AugmentParams p;
  p.crop_x = x;
  p.crop_y = y;
  p.crop_w = w;
  p.crop_h = h;
  return p;
}

/// Emits samples with their bytes in memory, `epochs` times over in the same order; those
/// listed in `missing` have neither bytes nor a file (decode_crop drops them: "cannot read
/// file").
class BytesSource final : public Source<Sample> {
 public:
  BytesSource(std::vector<Bytes> images, std::vector<std::uint64_t> missing, std::size_t epochs = 1)
      : images_(std::move(images)), missing_(std::move(missing)), epochs_(epochs) {}

 protected:
  std::optional<Sample> next() override {
    if (i_ == images_.size() * epochs_) return std::nullopt;
    const std::size_t index = i_ % images_.size();
    Sample s;
    s.index = index;
    s.epoch = static_cast<std::uint32_t>(i_ / images_.size());
    s.position = i_;
    s.label = static_cast<std::int64_t>(index);
    s.targets = {static_cast<float>(index) * 2};
    s.path = "img" + std::to_string(index);
    if (std::find(missing_.begin(), missing_.end(), index) != missing_.end()) {
      s.path = "/nonexistent/flowtrain/img" + std::to_string(index) + ".jpg";
    } else {
      s.encoded = EncodedBytes::own(images_[index]);
    }
    ++i_;
    return s;
  }

 private:
  std::vector<Bytes> images_;
  std::vector<std::uint64_t> missing_;
  std::size_t epochs_;
  std::size_t i_ = 0;
};


struct Batches {
  std::vector<at::Tensor> images, labels, targets;
  std::vector<std::vector<ViewKey>> views;
  std::vector<std::uint64_t> end_positions;
  RunReport report;
};

DecodeCropStage::Options crop_options(std::int64_t batch, int size) {
  DecodeCropStage::Options o;
  o.batch_size = batch;
  o.augment.size = size;
  o.augment.brightness = 0.3;
  o.augment.saturation = 0.3;
  o.augment.seed = 5;
  o.decode.bad_samples.max_bad_fraction = 0.5;
  o.pool.pool_size = 8;
  return o;
}

Batches run_crop_path(std::unique_ptr<Stage> source,
                      std::size_t concurrency,
                      std::int64_t batch,
                      int size = 32,
                      const std::function<void(DecodeCropStage::Options&)>& adjust = {}) {
  Batches got;
  DecodeCropStage::Options crop = crop_options(batch, size);
  if (adjust) adjust(crop);
  Pipeline p;
  p.add("source", std::move(source));
  p.add<DecodeCropStage>("crop", crop, {.concurrency = concurrency, .queue_capacity = 4});
  p.add<AssembleBatchStage>("assemble", {.batch_size = batch});
  p.add("sink", std::make_unique<testing::ProbeSink<Batch>>([&](Batch&& b, ItemContext&) {
          got.images.push_back(b.images.clone());
          got.labels.push_back(b.labels.clone());
          got.targets.push_back(b.targets.clone());
          got.views.push_back(b.views);
          got.end_positions.push_back(b.end_position);
        }));
  got.report = p.run({.threads = 4});
  return got;
}

/// Runs `stages` (YAML list items) between `source` and a sink that keeps copies of the batches.
Batches run_yaml(const std::string& source, const std::string& stages) {
  Registry registry = Registry::global();
  Batches got;
  testing::add_probe_sink<Batch>(registry, "sink", [&](Batch&& b, ItemContext&) {
    got.images.push_back(b.images.clone());
    got.labels.push_back(b.labels.clone());
    got.views.push_back(b.views);
    got.end_positions.push_back(b.end_position);
  });
  const std::string yaml = "threads: 2\nstages:\n" + source + stages + "  - {type: sink}\n";
  const PipelineConfig config = parse_pipeline_config(yaml, "test.yaml", {}, registry);
  got.report = build_pipeline(config, registry)->run(config.run);
  return got;
}

}  // namespace

TEST_CASE("Data.JpegCrop.ViewsDifferFromTheWholeImagePathOnlyByResampling") {
  // 640x360 and 307x173 (the food photos' size), train views at 112 and 224 px, eval views.
  for (const auto& [width, height] : {std::pair{640, 360}, std::pair{307, 173}}) {
    const Bytes bytes = photo(width, height, 3);
    for (const int size : {112, 224}) {
      double worst = 0, total = 0;
      int n = 0;
      for (std::uint64_t index = 0; index < 40; ++index) {
        const AugmentParams view =
            train_policy(11).draw(index, 0, static_cast<double>(width) / height);
        const Image a = old_view(bytes, view, size);
        const Image b = crop_view(bytes, view, size);
        REQUIRE(b.width == size);
        const double diff = mean_abs_diff(a, b);
        worst = std::max(worst, diff);
        total += diff;
        ++n;
      }
      CAPTURE(width);
      CAPTURE(size);
      CAPTURE(worst);
      // Mean absolute difference per channel, out of 255 (measured: 1.6 on average and 2.6 at
      // worst at 640x360 -> 112): resampling (DCT scaling then bilinear, against area
      // interpolation; MCU edges) moves pixels a little, never the view.
      CHECK(total / n < 2.0);
      CHECK(worst < 4.0);
    }
  }
}

TEST_CASE("Data.JpegCrop.FullScaleCropEqualsTheWholeDecodeInside") {
  // At scale 8/8 the crop decoder runs the same IDCT and colour conversion as TurboJPEG: away
  // from the strip's edges (where upsampling lacks its neighbours) the pixels are identical.
  const Bytes bytes = photo(320, 240, 1);
  Image whole;
  REQUIRE(decode_image(bytes, {}, whole).ok());
  JpegCropDecoder decoder;
  REQUIRE(decoder.read_header(bytes, 100'000'000));
  CHECK(decoder.width() == 320);
  CHECK(decoder.height() == 240);
  Image strip;
  PixelRect crop;
  REQUIRE(decoder.decode(region(0.3f, 0.4f, 0.5f, 0.5f), 1000, strip, crop));
  CHECK(decoder.scale_denom() == 1);
  const PixelRect full = crop_rect(region(0.3f, 0.4f, 0.5f, 0.5f), 320, 240);
  CHECK(crop.width == full.width);
  CHECK(crop.height == full.height);
  CHECK(crop.y == 0);
  CHECK(strip.width >= crop.x + crop.width);
  CHECK(strip.width < 320);  // only the MCU columns around the crop
  int differing = 0;
  for (int y = 2; y < crop.height - 2; ++y) {
    for (int x = 2; x < crop.width - 2; ++x) {
      for (int c = 0; c < 3; ++c) {
        const auto in_whole = whole.pixels[((full.y + y) * 320 + full.x + x) * 3 + c];
        const auto in_strip = strip.pixels[(y * strip.width + crop.x + x) * 3 + c];
        differing += in_whole != in_strip;
      }
    }
  }
  CHECK(differing == 0);
}

TEST_CASE("Data.JpegCrop.BadDataInsideOrOutsideTheCropIsRefused") {
  const Bytes good = photo(320, 240, 2);
  const AugmentParams top_left = region(0, 0, 0.25f, 0.25f);
  const AugmentParams bottom_right = region(0.75f, 0.75f, 0.25f, 0.25f);
  REQUIRE(!crop_view(good, top_left, 32).empty());
  REQUIRE(!crop_view(good, bottom_right, 32).empty());

  const std::map<std::string, Bytes> broken = {
      {"truncated",
       Bytes(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(good.size() / 2))},
      {"marker near the top", with_marker_in_scan(good, 0.1)},
      {"marker near the bottom", with_marker_in_scan(good, 0.9)}};
  for (const auto& [what, bytes] : broken) {
    CAPTURE(what);
    Image ignored;
    REQUIRE(!decode_image(bytes, {}, ignored).ok());  // the whole-image decoder refuses it
    CHECK(crop_view(bytes, top_left, 32).empty());
    CHECK(crop_view(bytes, bottom_right, 32).empty());
  }
  // A refusal leaves the decoder usable for the next image.
  CHECK(!crop_view(good, top_left, 32).empty());
}

TEST_CASE("Data.JpegCrop.StoppingAtTheCropsEndGivesTheSamePixelsAndReadsNoFurther") {
  using ReadTo = JpegCropDecoder::ReadTo;
  const Bytes good = photo(320, 240, 3);
  const AugmentParams top = region(0.1f, 0, 0.5f, 0.3f);
  const AugmentParams bottom = region(0.4f, 0.7f, 0.5f, 0.3f);
  for (const AugmentParams& view : {top, bottom}) {
    const Image whole_read = crop_view(good, view, 48, ReadTo::kImageEnd);
    const Image crop_read = crop_view(good, view, 48, ReadTo::kCropEnd);
    REQUIRE(!whole_read.empty());
    CHECK(crop_read.pixels == whole_read.pixels);
  }
  // Damage in the last tenth of the scan: below `top`'s crop, inside `bottom`'s.
  const std::map<std::string, Bytes> damaged = {
      {"truncated", Bytes(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(
                                                           good.size() * 9 / 10))},
      {"marker near the bottom", with_marker_in_scan(good, 0.9)}};
  for (const auto& [what, bytes] : damaged) {
    CAPTURE(what);
    CHECK(crop_view(bytes, top, 48, ReadTo::kImageEnd).empty());
    CHECK(crop_view(bytes, top, 48, ReadTo::kCropEnd).pixels ==
          crop_view(good, top, 48).pixels);  // the damage is never read
    CHECK(crop_view(bytes, bottom, 48, ReadTo::kCropEnd).empty());
  }
  // A decoder that stopped early takes the next image as usual.
  JpegCropDecoder decoder;
  Image strip;
  PixelRect crop;
  REQUIRE(decoder.read_header(good, 100'000'000));
  REQUIRE(decoder.decode(top, 48, strip, crop, ReadTo::kCropEnd));
  REQUIRE(decoder.read_header(good, 100'000'000));
  REQUIRE(decoder.decode(bottom, 48, strip, crop, ReadTo::kImageEnd));
}

TEST_CASE("Data.JpegCrop.IndexedFilesGiveTheSameCropPixels") {
  // Every sampling libjpeg upsamples differently (4:2:0, 4:2:2, 4:4:0, 4:4:4, gray), baseline
  // and progressive, sizes that are not whole MCUs, and views at every DCT scale: the crop's
  // pixels from the MCU index are those of the original, bit for bit.
  const Image rgb = render_synthetic_image(2, 4, 203, 141, 7, 9);
  const std::map<std::string, int> samplings = {{"420", TJSAMP_420}, {"422", TJSAMP_422},
                                                {"440", TJSAMP_440}, {"444", TJSAMP_444},
                                                {"gray", TJSAMP_GRAY}};
  for (const auto& [name, subsampling] : samplings) {
    for (const bool progressive : {false, true}) {
      CAPTURE(name);
      CAPTURE(progressive);
      const Bytes bytes = encode_with(rgb, subsampling, progressive);
      JpegCropDecoder decoder;
      REQUIRE(decoder.read_header(bytes, 100'000'000));
      const std::unique_ptr<const McuIndexedJpeg> indexed = decoder.index();
      REQUIRE(indexed != nullptr);
      CHECK(indexed->width() == 203);
      CHECK(indexed->height() == 141);
      std::map<int, int> scales;
      for (std::uint64_t index = 0; index < 60; ++index) {
        CAPTURE(index);
        const AugmentParams view = train_policy(3).draw(index, 0, 203.0 / 141);
        const int size = std::array{8, 16, 40, 100}[index % 4];
        Image a, b;
        PixelRect in_a, in_b;
        REQUIRE(decoder.read_header(bytes, 100'000'000));
        REQUIRE(decoder.decode(view, size, a, in_a, JpegCropDecoder::ReadTo::kCropEnd));
        const int scale = decoder.scale_denom();
        REQUIRE(decoder.decode(*indexed, view, size, b, in_b));
        CHECK(decoder.scale_denom() == scale);
        CHECK(in_b.width == in_a.width);
        CHECK(in_b.height == in_a.height);
        CHECK(b.width <= a.width);
        CHECK((crop_pixels(b, in_b) == crop_pixels(a, in_a)));
        ++scales[scale];
      }
      CHECK(scales.size() == 4);  // 1, 2, 4 and 8
    }
  }
  // Damage anywhere in the file refuses the index, as it refuses a decode read to the end.
  const Bytes good = photo(320, 240, 4);
  JpegCropDecoder decoder;
  for (const Bytes& bytes :
       {Bytes(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(good.size() * 9 / 10)),
        with_marker_in_scan(good, 0.95), with_marker_in_scan(good, 0.05)}) {
    REQUIRE(decoder.read_header(bytes, 100'000'000));
    CHECK(decoder.index() == nullptr);
  }
  REQUIRE(decoder.read_header(good, 100'000'000));  // and the decoder takes the next file
  const std::unique_ptr<const McuIndexedJpeg> indexed = decoder.index();
  REQUIRE(indexed != nullptr);
  CHECK(indexed->bytes() > good.size() / 2);
  CHECK(indexed->bytes() < good.size() * 2);
}

TEST_CASE("Data.DecodeCrop.FilesCheckedWholeOnceGiveTheSameBatchesAndDrops" *
          doctest::timeout(120)) {
  // 12 photos over 3 epochs: one has damage near its bottom, one is missing. Checked once, the
  // good files' second and third views come from their MCU index, or, with no room for it,
  // stop below their crops; the damaged file is read to the end and dropped in every epoch, and the
  // batches are those of reading every view to the end.
  std::vector<Bytes> images;
  for (std::uint64_t i = 0; i < 12; ++i) images.push_back(photo(160, 120, i));
  images[5] = with_marker_in_scan(images[5], 0.95);
  const std::vector<std::uint64_t> missing = {8};
  const auto run = [&](CheckWholeFile check, std::int64_t index_mb, std::size_t concurrency) {
    return run_crop_path(std::make_unique<BytesSource>(images, missing, 3), concurrency, 8, 32,
                         [&](DecodeCropStage::Options& o) {
                           o.check_whole_file = check;
                           o.mcu_index_mb = index_mb;
                         });
  };
  const Batches every_view = run(CheckWholeFile::kEveryView, 1024, 1);
  const Batches indexed = run(CheckWholeFile::kOnce, 1024, 1);
  const Batches indexed_parallel = run(CheckWholeFile::kOnce, 1024, 2);
  const Batches stopping = run(CheckWholeFile::kOnce, 0, 1);
  const Batches stopping_parallel = run(CheckWholeFile::kOnce, 0, 2);
  const auto result = [](const Batches& got, const char* name) {
    return testing::result(got.report, "crop", name);
  };
  CHECK(result(every_view, "stopped_below_crop") + result(every_view, "views_from_index") == 0);
  CHECK(result(every_view, "indexed_files") == 0);
  CHECK(result(indexed, "views_from_index") == 10 * 2);  // 10 good files, 2 later epochs
  CHECK(result(indexed, "indexed_files") == 10);
  CHECK(result(indexed, "index_mb") > 0);
  CHECK(result(indexed, "stopped_below_crop") == 0);
  CHECK(result(indexed_parallel, "views_from_index") > 0);
  CHECK(result(stopping, "stopped_below_crop") == 10 * 2);
  CHECK(result(stopping, "views_from_index") + result(stopping, "indexed_files") == 0);
  CHECK(result(stopping_parallel, "stopped_below_crop") > 0);
  // A run of one epoch indexes nothing: only a file's second view does.
  const Batches one_epoch = run_crop_path(std::make_unique<BytesSource>(images, missing, 1), 1, 8,
                                          32);
  CHECK(result(one_epoch, "indexed_files") == 0);
  CHECK(one_epoch.report.stages[1].dropped == 2);
  for (const Batches* got : {&indexed, &indexed_parallel, &stopping, &stopping_parallel}) {
    const StageReport& crop = got->report.stages[1];
    CHECK(crop.dropped == 6);  // the damaged and the missing file, in each of 3 epochs
    int damaged_drops = 0;
    for (const DropRecord& drop : crop.drops) {
      damaged_drops += drop.reason.rfind("img5: ", 0) == 0 ? 1 : 0;
    }
    CHECK(damaged_drops == 3);
    REQUIRE(got->images.size() == every_view.images.size());
    for (std::size_t b = 0; b < every_view.images.size(); ++b) {
      CAPTURE(b);
      CHECK(at::equal(got->images[b], every_view.images[b]));
      CHECK(at::equal(got->labels[b], every_view.labels[b]));
      CHECK((got->views[b] == every_view.views[b]));
    }
  }
}

TEST_CASE("Data.DecodeCrop.GrayCmykAndPngAllBecomeRows" * doctest::timeout(60)) {
  const Image rgb = render_synthetic_image(1, 4, 96, 72, 7, 1);  // the picture of photo(96, 72, 1)
  const Bytes gray = encode_gray_jpeg(rgb, 90);
  const Bytes cmyk = encode_cmyk_jpeg(rgb, 90);
  cv::Mat bgr;
  cv::cvtColor(cv::Mat(72, 96, CV_8UC3, const_cast<std::uint8_t*>(rgb.pixels.data())), bgr,
               cv::COLOR_RGB2BGR);
  Bytes png;
  REQUIRE(cv::imencode(".png", bgr, png));

  JpegCropDecoder decoder;
  CHECK(decoder.read_header(gray, 100'000'000));   // libjpeg expands gray to RGB itself
  CHECK(!decoder.read_header(cmyk, 100'000'000));  // CMYK: the whole-image decoder's job
  CHECK(!decoder.read_header(png, 100'000'000));
  const Image gray_view = crop_view(gray, region(0.1f, 0.2f, 0.6f, 0.7f), 24);
  REQUIRE(gray_view.width == 24);
  for (std::size_t i = 0; i < gray_view.pixels.size(); i += 3) {
    CHECK(gray_view.pixels[i] == gray_view.pixels[i + 1]);
    CHECK(gray_view.pixels[i] == gray_view.pixels[i + 2]);
  }

  const Batches got = run_crop_path(
      std::make_unique<BytesSource>(std::vector<Bytes>{photo(96, 72, 1), gray, cmyk, png},
                                    std::vector<std::uint64_t>{}),
      2, 4, 24, [](DecodeCropStage::Options& o) {  // whole-image views, unflipped, unjittered
        o.augment.scale = {1, 1};
        o.augment.ratio = {4.0 / 3, 4.0 / 3};
        o.augment.flip = 0;
        o.augment.brightness = 0;
        o.augment.saturation = 0;
      });
  CHECK(got.report.stages[1].dropped == 0);
  REQUIRE(got.images.size() == 1);
  CHECK(got.images[0].size(0) == 4);
  // Rows 2 and 3 (CMYK, PNG) hold the same picture as row 0 (the colour JPEG) up to coding.
  for (const std::int64_t row : {2, 3}) {
    CAPTURE(row);
    CHECK((got.images[0][row] - got.images[0][0]).abs().mean().item<double>() < 0.1);
  }
}

TEST_CASE("Data.DecodeCrop.BadFilesDroppedWithTheWholeDecodersReason" * doctest::timeout(60)) {
  testing::TempDir dir("decode-crop-bad");
  SyntheticOptions synthetic;
  synthetic.root = dir.str();
  synthetic.count = 60;
  synthetic.width = 96;
  synthetic.height = 64;
  synthetic.classes = 2;
  synthetic.broken_fraction = 0.1;  // each of the 6 broken kinds once
  const GeneratedDataset set = generate_jpeg_dataset(synthetic);
  // And a lossless WebP of a few KB that declares 16000x16000 pixels: refused from its header.
  const std::string huge = dir.str("class_00/declares-16000.webp");
  {
    const Bytes webp = testing::declaring("WebP lossless", 16000);
    std::ofstream(huge, std::ios::binary)
        .write(reinterpret_cast<const char*>(webp.data()),
               static_cast<std::streamsize>(webp.size()));
  }
  const RunReport report =
      run_yaml("  - {type: image_folder, params: {root: '" + dir.str() +
                   "', shuffle: false, extensions: 'jpg,webp'}}\n",
               "  - {type: decode_crop, concurrency: 2, params: {size: 32, batch_size: 8, "
               "max_bad_fraction: 0.5, max_pixels: 10000000}}\n"
               "  - {type: assemble_batch, params: {batch_size: 8}}\n")
          .report;
  const StageReport& crop = report.stages[1];
  CHECK(crop.dropped == set.broken_count() + 1);
  std::string listed;
  for (const auto& drop : crop.drops) listed += drop.reason + "\n";
  for (const GeneratedFile& file : set.files) {
    if (file.broken == BrokenKind::kNone) continue;
    CAPTURE(to_string(file.broken));
    CHECK(listed.find(file.path + ": ") != std::string::npos);
  }
  CHECK(listed.find("truncated JPEG data") != std::string::npos);
  CHECK(listed.find("corrupt JPEG data") != std::string::npos);
  CHECK(listed.find("exceeds max_pixels") != std::string::npos);
  CHECK(listed.find(huge + ": image 16000x16000 exceeds max_pixels 10000000\n") !=
        std::string::npos);
  CHECK(report.stages[2].items_out == 8);  // 61 samples: 8 batches whatever was dropped
}

TEST_CASE("Data.DecodeCrop.BatchesBitIdenticalForConcurrency1And3" * doctest::timeout(120)) {
  std::vector<Bytes> images;
  for (std::uint64_t i = 0; i < 70; ++i) images.push_back(photo(120 + 20 * (i % 3), 90, i));
  const std::vector<std::uint64_t> missing = {4, 15, 40};
  const Batches serial = run_crop_path(std::make_unique<BytesSource>(images, missing), 1, 16);
  const Batches parallel = run_crop_path(std::make_unique<BytesSource>(images, missing), 3, 16);
  REQUIRE(serial.images.size() == 5);  // ceil(70 / 16): drops do not change the count
  REQUIRE(parallel.images.size() == serial.images.size());
  for (std::size_t b = 0; b < serial.images.size(); ++b) {
    CAPTURE(b);
    CHECK(at::equal(serial.images[b], parallel.images[b]));
    CHECK(at::equal(serial.labels[b], parallel.labels[b]));
    CHECK(at::equal(serial.targets[b], parallel.targets[b]));
    CHECK((serial.views[b] == parallel.views[b]));
  }
}

TEST_CASE("Data.DecodeCrop.DropLeavesItsBatchShorterAndKeepsTheOthers" * doctest::timeout(60)) {
  std::vector<Bytes> images;
  for (std::uint64_t i = 0; i < 40; ++i) images.push_back(photo(80, 60, i));
  // 5 is inside batch 0, 31 is the last row of batch 1 (the batch closes on the next one's
  // first row), 32..47 are all of batch 2 (no batch at all), and 48..55 the last, short batch.
  std::vector<std::uint64_t> missing = {5, 31};
  for (std::uint64_t i = 32; i < 48; ++i) missing.push_back(i);
  images.resize(56, photo(80, 60, 99));
  const Batches got = run_crop_path(std::make_unique<BytesSource>(images, missing), 2, 16);
  REQUIRE(got.labels.size() == 3);
  CHECK(got.report.stages[1].dropped == 18);
  CHECK(got.labels[2].size(0) == 8);
  CHECK(got.labels[2][0].item<std::int64_t>() == 48);
  std::vector<std::int64_t> batch0, batch1;
  for (std::int64_t i = 0; i < 16; ++i) {
    if (i != 5) batch0.push_back(i);
    if (i != 15) batch1.push_back(16 + i);
  }
  CHECK(std::vector<std::int64_t>(got.labels[0].data_ptr<std::int64_t>(),
                                  got.labels[0].data_ptr<std::int64_t>() + 15) == batch0);
  CHECK(std::vector<std::int64_t>(got.labels[1].data_ptr<std::int64_t>(),
                                  got.labels[1].data_ptr<std::int64_t>() + 15) == batch1);
  // Rows moved up to close the gap keep their targets and views.
  CHECK(got.targets[0][5].item<float>() == 12.0f);
  CHECK(got.views[0][5].index == 6);
  CHECK(got.end_positions == std::vector<std::uint64_t>{16, 32, 56});
  // A moved row holds what the same sample gives in a batch without drops.
  const Batches clean =
      run_crop_path(std::make_unique<BytesSource>(images, std::vector<std::uint64_t>{}), 2, 16);
  CHECK(at::equal(got.images[0][5], clean.images[0][6]));
}

TEST_CASE("Data.DecodeCrop.InFlightBatchesNeverExceedThePool" * doctest::timeout(120)) {
  // The slow sink's queue could hold 4 batches, more than the pool of 3: decode_crop must wait
  // for buffers to come back rather than allocate, and still deliver every batch. The sink
  // holds its first batch until decode_crop has found the pool empty, so the wait happens
  // however the machine's load paces the two.
  std::vector<Bytes> images(60, photo(64, 48, 3));
  DecodeCropStage::Options options = crop_options(4, 16);
  options.pool.pool_size = 3;
  auto crop = std::make_unique<DecodeCropStage>(options);
  DecodeCropStage& stage = *crop;
  Pipeline p;
  p.add("source", std::make_unique<BytesSource>(images, std::vector<std::uint64_t>{}));
  p.add("crop", std::move(crop), {.concurrency = 2, .queue_capacity = 2});
  p.add<AssembleBatchStage>("assemble", {.batch_size = 4}, {.queue_capacity = 2});
  bool first = true;
  p.add("slow_sink", std::make_unique<testing::ProbeSink<Batch>>([&](Batch&& b, ItemContext&) {
          CHECK(b.size() == 4);
          for (int ms = 0; first && stage.pool_stats().waits == 0 && ms < 30'000; ++ms) {
            testing::sleep_us(1000);
          }
          first = false;
          testing::sleep_us(1000);
        }),
        {.queue_capacity = 4});
  const RunReport r = p.run({.threads = 2});
  CHECK(r.stages[3].items_in == 15);
  CHECK(stage.pool_stats().waits > 0);
  CHECK(stage.pool_stats().allocated == 3);
  CHECK(stage.pool_stats().peak_in_use <= 3);
}

TEST_CASE("Data.DecodeCrop.SameBatchesAsDecodeAugmentCollate" * doctest::timeout(120)) {
  // The same samples in the same rows with the same views; pixels within resampling.
  testing::TempDir dir("decode-crop-same");
  SyntheticOptions synthetic;
  synthetic.root = dir.str();
  synthetic.count = 100;
  synthetic.width = 200;
  synthetic.height = 150;
  synthetic.classes = 4;
  generate_jpeg_dataset(synthetic);
  const std::string source =
      "  - {type: image_folder, params: {root: '" + dir.str() + "', seed: 9, epochs: 2}}\n";
  const std::string view = "size: 64, brightness: 0.2, contrast: 0.2, seed: 4";
  auto run = [&](const std::string& stages) { return run_yaml(source, stages); };
  const Batches v1 =
      run("  - {type: jpeg_decode, concurrency: 2}\n"
          "  - {type: augment, concurrency: 2, params: {" +
          view +
          "}}\n"
          "  - {type: collate, params: {batch_size: 24}}\n");
  const Batches fused = run("  - {type: decode_crop, concurrency: 2, params: {batch_size: 24, " +
                            view + "}}\n  - {type: assemble_batch, params: {batch_size: 24}}\n");
  REQUIRE(v1.images.size() == 9);  // 200 samples in batches of 24
  REQUIRE(fused.images.size() == v1.images.size());
  for (std::size_t b = 0; b < v1.images.size(); ++b) {
    CAPTURE(b);
    for (std::size_t r = 0; r < v1.views[b].size(); ++r) {
      const ViewKey& a = fused.views[b][r];
      const ViewKey& c = v1.views[b][r];
      CHECK((a.index == c.index && a.epoch == c.epoch && a.augment == c.augment));
      // Their pixels differ by resampling: a teacher cache must not take one for the other.
      CHECK(a.recipe != c.recipe);
    }
    CHECK(at::equal(fused.labels[b], v1.labels[b]));
    CHECK(fused.end_positions[b] == v1.end_positions[b]);
    // Normalised units (pixel / 255 / std): 0.08 is about 5 levels of 255; another view or
    // sample would differ by 0.5 and more.
    const double diff = (fused.images[b] - v1.images[b]).abs().mean().item<double>();
    CHECK(diff < 0.08);
  }
}

TEST_CASE("Data.DecodeCrop.AssembleNamesAMismatchedBatchSize" * doctest::timeout(60)) {
  std::vector<Bytes> images(4, photo(64, 48, 1));
  Pipeline p;
  p.add("source", std::make_unique<BytesSource>(images, std::vector<std::uint64_t>{}));
  p.add<DecodeCropStage>("crop", crop_options(2, 16));
  p.add<AssembleBatchStage>("assemble", {.batch_size = 3});
  p.add("sink", std::make_unique<testing::ProbeSink<Batch>>([](Batch&&, ItemContext&) {}));
  CHECK_THROWS_WITH_AS(p.run({.threads = 2}),
                       doctest::Contains("give both stages the same batch_size"), Error);
}
