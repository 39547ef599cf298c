#include <ATen/ATen.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "distributed/device.hpp"
#include "graph/config.hpp"
#include "graph/error.hpp"
#include "graph/pipeline.hpp"
#include "graph/registry.hpp"
#include "stages/data/batching/collate.hpp"
#include "stages/data/batching/stage_to_device.hpp"
#include "stages/data/sources/synthetic.hpp"
#include "stages/data/transforms/augment.hpp"
#include "tests/test_stages.hpp"

using namespace flowtrain;
using namespace flowtrain::data;

namespace {

// A deterministic RGB image whose content depends on (index, x, y).
Image make_image(std::uint64_t index, int width, int height) {
  Image img{width, height, 3,
            PixelBuffer(static_cast<std::size_t>(width) * height * 3)};
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      std::uint8_t* px = &img.pixels[(static_cast<std::size_t>(y) * width + x) * 3];
      px[0] = static_cast<std::uint8_t>(x * 255 / std::max(1, width - 1));
      px[1] = static_cast<std::uint8_t>(y * 255 / std::max(1, height - 1));
      px[2] = static_cast<std::uint8_t>((index * 37 + x * y) % 256);
    }
  }
  return img;
}

// Emits decoded-looking samples of varying sizes, as jpeg_decode would.
class ImageSource final : public Source<Sample> {
 public:
  ImageSource(std::uint64_t count, int targets = 1) : count_(count), targets_(targets) {}

 protected:
  std::optional<Sample> next() override {
    if (i_ == count_) return std::nullopt;
    Sample s;
    s.index = i_;
    s.path = "img" + std::to_string(i_);
    s.label = static_cast<std::int64_t>(i_ % 5);
    s.targets.assign(static_cast<std::size_t>(targets_), static_cast<float>(i_) * 0.5f);
    s.image =
        make_image(i_, 40 + static_cast<int>(i_ % 7) * 10, 30 + static_cast<int>(i_ % 3) * 20);
    ++i_;
    return s;
  }

 private:
  std::uint64_t count_;
  int targets_;
  std::uint64_t i_ = 0;
};

AugmentStage::Options augment_options(AugmentPolicy::Mode mode, int size) {
  return {
      .mode = mode, .size = size, .brightness = 0.4, .contrast = 0.4, .saturation = 0.4, .seed = 7};
}

CollateStage::Options collate_options(std::int64_t batch, std::int64_t pool) {
  return {.batch_size = batch, .pool = {.pool_size = pool}};
}

struct Collected {
  std::vector<at::Tensor> images, labels, targets;
  std::vector<std::vector<ViewKey>> views;
};

// source -> augment (concurrency) -> collate -> sink that keeps copies of the batches.
Collected run_data_path(std::size_t augment_concurrency, std::uint64_t count, std::int64_t batch) {
  Collected got;
  Pipeline p;
  p.add("source", std::make_unique<ImageSource>(count));
  p.add<AugmentStage>("augment", augment_options(AugmentPolicy::Mode::kTrain, 24),
                      {.concurrency = augment_concurrency});
  p.add<CollateStage>("collate", collate_options(batch, 3));
  p.add("sink", std::make_unique<testing::ProbeSink<Batch>>([&](Batch&& b, ItemContext&) {
          got.images.push_back(b.images.clone());
          got.labels.push_back(b.labels.clone());
          got.targets.push_back(b.targets.clone());
          got.views.push_back(b.views);
        }));
  p.run({.threads = 4});
  return got;
}

}  // namespace

TEST_CASE("Data.Augment.ParamsDependOnlyOnSeedEpochIndex") {
  AugmentPolicy::Options o;
  o.brightness = o.contrast = o.saturation = 0.3;
  o.seed = 3;
  const AugmentPolicy policy(o);
  const AugmentParams a = policy.draw(10, 0, 1.5);
  CHECK(policy.draw(10, 0, 1.5) == a);
  CHECK_FALSE(policy.draw(10, 1, 1.5) == a);  // a new epoch, a new view
  CHECK_FALSE(policy.draw(11, 0, 1.5) == a);
  o.seed = 4;
  CHECK_FALSE(AugmentPolicy(o).draw(10, 0, 1.5) == a);
  for (std::uint64_t i = 0; i < 500; ++i) {
    const AugmentParams p = policy.draw(i, 2, 0.6 + 0.01 * static_cast<double>(i % 200));
    REQUIRE(p.crop_x >= 0);
    REQUIRE(p.crop_y >= 0);
    REQUIRE(p.crop_x + p.crop_w <= 1.0001f);
    REQUIRE(p.crop_y + p.crop_h <= 1.0001f);
    REQUIRE(p.brightness >= 0.7f - 1e-6f);
    REQUIRE(p.brightness <= 1.3f + 1e-6f);
  }
}

TEST_CASE("Data.Augment.FixedViewsEachOnceInKEpochsThenAgain") {
  AugmentPolicy::Options o;
  o.seed = 3;
  const AugmentPolicy fresh(o);
  o.views_per_image = 3;
  const AugmentPolicy fixed(o);
  for (std::uint64_t index = 0; index < 50; ++index) {
    CAPTURE(index);
    std::vector<std::uint32_t> views;
    for (std::uint32_t epoch = 0; epoch < 3; ++epoch) views.push_back(fixed.view(index, epoch));
    std::sort(views.begin(), views.end());
    CHECK(views == std::vector<std::uint32_t>{0, 1, 2});  // every view once in K epochs
    for (std::uint32_t epoch = 3; epoch < 9; ++epoch) {
      CHECK(fixed.draw(index, epoch, 1.5) == fixed.draw(index, epoch - 3, 1.5));  // then again
    }
    // A view is the one `fresh` draws for that view's number as the epoch.
    CHECK(fixed.draw(index, 0, 1.5) == fresh.draw(index, fixed.view(index, 0), 1.5));
    CHECK(fresh.view(index, 7) == 7);  // without fixed views, every epoch is its own
  }
}

TEST_CASE("Data.Augment.RecipeNamesThePixelParamsNotTheViewChoice") {
  AugmentOptions a;
  const std::uint64_t recipe = a.recipe(0);
  AugmentOptions b = a;
  b.seed = 9;
  b.views_per_image = 10;
  CHECK(b.recipe(0) == recipe);  // they choose views; a view's key holds its parameters
  b.scale = {0.5, 1.0};
  CHECK(b.recipe(0) != recipe);
  b = a;
  b.size = 96;
  CHECK(b.recipe(0) != recipe);
  CHECK(a.recipe(1) != recipe);  // mixed into what came before
}

TEST_CASE("Data.Augment.EvalIsTheCentreCrop") {
  AugmentPolicy::Options o;
  o.mode = AugmentPolicy::Mode::kEval;
  const AugmentParams p = AugmentPolicy(o).draw(0, 0, 2.0);  // twice as wide as high
  CHECK(p.crop_h == doctest::Approx(0.875));
  CHECK(p.crop_w == doctest::Approx(0.4375));
  CHECK(p.crop_x == doctest::Approx(0.28125));
  CHECK(p.crop_y == doctest::Approx(0.0625));
  CHECK_FALSE(p.flip);
  CHECK(p.brightness == 1.0f);
}

// An eval view is decoded at the short side its centre crop needs to be a downscale, not at
// the view's size (whose crop the resize would then enlarge).
TEST_CASE("Data.Augment.EvalDecodesAtTheSideItsCropNeeds") {
  AugmentPolicy::Options o;
  o.mode = AugmentPolicy::Mode::kEval;
  CHECK(AugmentPolicy(o).eval_decode_side(96) == 110);  // ceil(96 / 0.875)
  CHECK(AugmentPolicy(o).eval_decode_side(224) == 256);
  for (const double crop : {0.875, 0.9, 0.95, 1.0}) {
    o.eval_crop = crop;
    for (const int size : {32, 96, 112, 224, 384}) {
      CAPTURE(crop);
      CAPTURE(size);
      const int side = AugmentPolicy(o).eval_decode_side(size);
      CHECK(side * crop >= size - 1e-6);       // the crop of that side covers the view
      CHECK((side - 1) * crop < size - 1e-6);  // and it is the smallest such side
    }
  }
}

TEST_CASE("Data.Augment.CropResizeFlipPixels") {
  const Image in = make_image(0, 64, 32);
  AugmentParams p;  // the whole image
  p.flip = true;
  Image out;
  apply_augment(in, p, 32, out);
  REQUIRE(out.width == 32);
  REQUIRE(out.pixels.size() == 32u * 32u * 3u);
  // Red grows with x in the input; flipped, it falls with x in the output.
  CHECK(out.pixels[0] > out.pixels[31 * 3]);
  // Left half of the image, not flipped: the red of the output spans the input's first half.
  AugmentParams left;
  left.crop_w = 0.5f;
  apply_augment(in, left, 32, out);
  CHECK(out.pixels[31 * 3] <= 130);
  CHECK(out.pixels[31 * 3] >= 115);
}

TEST_CASE("Data.Collate.NormalisesIntoNchw" * doctest::timeout(60)) {
  Collected got;
  Pipeline p;
  p.add("source", std::make_unique<ImageSource>(10, 2));
  p.add<AugmentStage>("augment", augment_options(AugmentPolicy::Mode::kEval, 8));
  p.add<CollateStage>("collate", collate_options(4, 2));
  std::vector<Image> views;
  p.add("sink", std::make_unique<testing::ProbeSink<Batch>>([&](Batch&& b, ItemContext&) {
          got.images.push_back(b.images.clone());
          got.labels.push_back(b.labels.clone());
          got.targets.push_back(b.targets.clone());
        }));
  p.run({.threads = 2});

  REQUIRE(got.images.size() == 3);  // 4 + 4 + 2
  CHECK(got.images[2].size(0) == 2);
  CHECK(got.images[0].sizes() == at::IntArrayRef({4, 3, 8, 8}));
  CHECK(got.labels[1][1].item<std::int64_t>() == 5 % 5);
  CHECK(got.targets[2][1][1].item<float>() == doctest::Approx(4.5));  // sample 9, 2 targets

  // Recompute sample 5's eval view and its normalisation by hand.
  const Image src = make_image(5, 40 + 5 * 10, 30 + 2 * 20);
  AugmentPolicy::Options o;
  o.mode = AugmentPolicy::Mode::kEval;
  Image view;
  apply_augment(src, AugmentPolicy(o).draw(5, 0, 90.0 / 70.0), 8, view);
  const double mean[3] = {0.485, 0.456, 0.406}, stdev[3] = {0.229, 0.224, 0.225};
  const at::Tensor row = got.images[1][1];  // sample 5
  for (int c = 0; c < 3; ++c) {
    for (int y = 0; y < 8; y += 3) {
      for (int x = 0; x < 8; x += 3) {
        const double expected = (view.pixels[(y * 8 + x) * 3 + c] / 255.0 - mean[c]) / stdev[c];
        REQUIRE(row[c][y][x].item<float>() == doctest::Approx(expected).epsilon(1e-5));
      }
    }
  }
}

TEST_CASE("Data.Collate.BatchesBitIdenticalForConcurrency1And4" * doctest::timeout(120)) {
  const Collected serial = run_data_path(1, 70, 16);
  const Collected parallel = run_data_path(4, 70, 16);
  REQUIRE(serial.images.size() == 5);
  REQUIRE(parallel.images.size() == serial.images.size());
  for (std::size_t b = 0; b < serial.images.size(); ++b) {
    CAPTURE(b);
    CHECK(at::equal(serial.images[b], parallel.images[b]));
    CHECK(at::equal(serial.labels[b], parallel.labels[b]));
    CHECK((serial.views[b] == parallel.views[b]));  // (no printing: ViewKey has no operator<<)
  }
  // Sample order is preserved: batch 1 holds samples 16..31.
  CHECK(serial.views[1].front().index == 16);
  CHECK(serial.views[1].back().index == 31);
}

TEST_CASE("Data.Collate.InFlightBatchesNeverExceedThePool" * doctest::timeout(120)) {
  auto collate = std::make_unique<CollateStage>(collate_options(4, 2));
  CollateStage& stage = *collate;
  std::atomic<std::int64_t> alive{0}, peak{0};
  Pipeline p;
  p.add("source", std::make_unique<ImageSource>(80));
  p.add<AugmentStage>("augment", augment_options(AugmentPolicy::Mode::kTrain, 16),
                      {.concurrency = 2});
  p.add("collate", std::move(collate));
  // The sink's queue could hold 4 batches: more than the pool, so collate must wait for
  // buffers to come back rather than allocate.
  p.add("slow_sink", std::make_unique<testing::ProbeSink<Batch>>([&](Batch&&, ItemContext&) {
          testing::raise_max(peak, alive.fetch_add(1) + 1);
          testing::sleep_us(3000);
          alive.fetch_sub(1);
        }),
        {.queue_capacity = 4});
  const RunReport r = p.run({.threads = 2});
  CHECK(r.stages[3].items_in == 20);
  CHECK(stage.pool_stats().allocated == 2);
  CHECK(stage.pool_stats().peak_in_use <= 2);
  // Its waits for a buffer are reported as such, naming the param that adds buffers.
  CHECK(stage.pool_stats().waits > 0);
  CHECK(r.stages[2].waiting.seconds == doctest::Approx(stage.pool_stats().wait_s));
  CHECK(r.stages[2].waiting.seconds > 0);
  CHECK(r.stages[2].waiting.what == "a free batch buffer");
  CHECK(r.stages[2].waiting.param == "pool_size");
  CHECK(r.stages[2].waiting.value == 2);
}

TEST_CASE("Data.Collate.RejectsCudaWithoutCuda") {
  CollateStage::Options o = collate_options(4, 2);
  o.pool.device = "cuda:0";
  if (dist::visible_gpus() == 0) {
    CHECK_THROWS_WITH_AS(CollateStage{o}, doctest::Contains("param 'device': 'cuda:0' "), Error);
  }
  o.pool.device = "tpu";
  CHECK_THROWS_WITH_AS(CollateStage{o},
                       "param 'device' must be auto, cpu, cuda or cuda:N, got 'tpu'", Error);
}

TEST_CASE("Data.StageToDevice.OnCpuEachBatchPassesAsIs" * doctest::timeout(120)) {
  // The staging node between collate and the model: on cpu the batches are where the model
  // runs, so each passes with its own pooled storage (no copy), in order, and the pool's
  // buffers still go back (3 buffers serve 6 batches).
  std::vector<const void*> storage;
  std::vector<std::uint64_t> numbers;
  Pipeline p;
  p.add("source", std::make_unique<ImageSource>(24));
  p.add<AugmentStage>("augment", augment_options(AugmentPolicy::Mode::kTrain, 24));
  p.add<CollateStage>("collate", collate_options(4, 3));
  p.add("collated", [&](Batch b) {
    storage.push_back(b.images.data_ptr());
    return b;
  });
  p.add<StageToDeviceStage>("stage_to_device", {.device = "cpu"}, {.concurrency = 2, .queue_capacity = 2});
  p.add("sink", [&](Batch b) {
    CHECK(b.images.data_ptr() == storage.at(b.number));
    CHECK(b.images.device().is_cpu());
    numbers.push_back(b.number);
  }, {.ordered = true});
  const RunReport report = p.run({.threads = 2});
  CHECK(numbers == std::vector<std::uint64_t>{0, 1, 2, 3, 4, 5});
  CHECK(report.stages[4].items_out == 6);
  if (dist::visible_gpus() == 0) {
    CHECK_THROWS_WITH_AS(StageToDeviceStage({.device = "cuda"}),
                         doctest::Contains("param 'device': 'cuda' "), Error);
  }
}

TEST_CASE("Data.Registry.EveryDataStageRegistered") {
  for (const char* type :
       {"image_folder", "csv_manifest", "shard", "jpeg_decode", "augment", "collate", "decode_crop",
        "assemble_batch", "stage_to_device", "mixup"}) {
    CAPTURE(type);
    const StageInfo* info = Registry::global().find(type);
    REQUIRE(info != nullptr);
    CHECK(!info->doc.summary.empty());
    for (const ParamSpec& p : info->doc.params) CHECK(!p.doc.empty());
  }
}

TEST_CASE("Data.Path.BatchesBitIdenticalWithRealJpegsForConcurrency1And4" * doctest::timeout(120)) {
  const std::string root =
      (std::filesystem::temp_directory_path() / "flowtrain_data_path_test").string();
  std::filesystem::remove_all(root);
  SyntheticOptions synthetic;
  synthetic.root = root;
  synthetic.count = 150;
  synthetic.width = 120;
  synthetic.height = 80;
  synthetic.classes = 3;
  synthetic.broken_fraction = 0.04;  // 6 broken files, dropped the same way each time
  generate_jpeg_dataset(synthetic);

  auto run = [&](int concurrency) {
    const std::string c = std::to_string(concurrency);
    const std::string yaml =
        "threads: 4\nstages:\n"
        "  - {type: image_folder, params: {root: '" + root + "', seed: 3, epochs: 2}}\n"
        "  - {type: jpeg_decode, concurrency: " + c +
        ", params: {min_side: 40, max_bad_fraction: 0.5}}\n"
        "  - {type: augment, concurrency: " + c + ", params: {size: 32, brightness: 0.3}}\n"
        "  - {type: collate, params: {batch_size: 32}}\n"
        "  - {type: sink}\n";
    Registry registry = Registry::global();
    Collected got;
    testing::add_probe_sink<Batch>(registry, "sink", [&](Batch&& b, ItemContext&) {
      got.images.push_back(b.images.clone());
      got.labels.push_back(b.labels.clone());
      got.views.push_back(b.views);
    });
    const PipelineConfig config = parse_pipeline_config(yaml, "path.yaml", {}, registry);
    const RunReport report = build_pipeline(config, registry)->run(config.run);
    CHECK(report.stages[1].dropped == 12);  // 6 broken files, 2 epochs
    return got;
  };
  const Collected serial = run(1);
  const Collected parallel = run(4);
  REQUIRE(serial.images.size() == 9);  // 288 good samples: 9 batches of 32
  REQUIRE(parallel.images.size() == serial.images.size());
  for (std::size_t b = 0; b < serial.images.size(); ++b) {
    CAPTURE(b);
    CHECK(at::equal(serial.images[b], parallel.images[b]));
    CHECK(at::equal(serial.labels[b], parallel.labels[b]));
    CHECK((serial.views[b] == parallel.views[b]));
  }
  std::filesystem::remove_all(root);
}
