#include <doctest/doctest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <numeric>

#include "graph/config.hpp"
#include "graph/error.hpp"
#include "graph/pipeline.hpp"
#include "stages/data/batch.hpp"
#include "stages/train/files/checkpoint.hpp"
#include "stages/train/inference/teacher_cache.hpp"
#include "stages/train/inference/teacher_infer.hpp"
#include "stages/train/models/vit.hpp"
#include "tests/test_stages.hpp"
#include "tests/train/seen_batches.hpp"
#include "tests/train/training_fixture.hpp"

using namespace flowtrain;
using namespace flowtrain::train;
using namespace flowtrain::testing;

namespace {

// Batches of 8 random 32 px images whose rows are views of images "img_K.jpg"; batch n shows
// the views of batch `view_of(n)`, so views may repeat within a run.
class ViewBatches final : public Source<data::Batch> {
 public:
  ViewBatches(
      int count, std::function<int(int)> view_of = [](int n) { return n; })
      : count_(count), view_of_(std::move(view_of)) {}

 protected:
  std::optional<data::Batch> next() override {
    if (number_ == count_) return std::nullopt;
    const int v = view_of_(number_);
    torch::manual_seed(100 + v);
    data::Batch batch;
    batch.number = static_cast<std::uint64_t>(number_++);
    batch.images = torch::rand({8, 3, 32, 32});
    batch.labels = torch::zeros({8}, torch::kLong);
    for (int r = 0; r < 8; ++r) {
      data::ViewKey key;
      key.index = static_cast<std::uint64_t>(r);
      key.augment.crop_x = 0.01f * static_cast<float>(v);
      key.augment.flip = r % 2 == 1;
      key.recipe = 42;
      batch.views.push_back(key);
      batch.paths.push_back("img_" + std::to_string(r) + ".jpg");
    }
    return batch;
  }

 private:
  int count_;
  std::function<int(int)> view_of_;
  int number_ = 0;
};

void write_teacher(const std::string& path, std::uint64_t seed, int depth = 1) {
  torch::manual_seed(seed);
  ViT teacher(ModelConfig{.image_size = 32,
                          .patch_size = 8,
                          .dim = 32,
                          .depth = depth,
                          .heads = 2,
                          .classes = 20,
                          .regression_outputs = 1});
  save_checkpoint(path, teacher, nullptr, {});
}

std::map<std::string, double> results_of(const RunReport& report, const std::string& stage) {
  std::map<std::string, double> out;
  for (const StageReport& s : report.stages) {
    if (s.name != stage) continue;
    for (const StageResult& r : s.results) out[r.name] = r.value;
  }
  return out;
}

//   batches -> cache --hit--------------------> merge -> sink
//                    \--miss--> teacher_infer --/
// With `partitions`, teacher_infer is followed by its partition nodes, as a config would add.
RunReport run_cached(
    SeenBatches& seen,
    const TeacherCacheOptions& cache,
    const std::string& teacher,
    int batches,
    std::function<int(int)> view_of = [](int n) { return n; },
    const BuildContext& context = {},
    int partitions = 1) {
  Pipeline p;
  p.add("batches", std::make_unique<ViewBatches>(batches, std::move(view_of)));
  p.add("cache", std::make_unique<TeacherCacheStage>(cache, context));
  const TeacherInferOptions options{.inference = {.model = teacher}, .partitions = partitions};
  p.add<TeacherInferStage>("teacher", options,
                           {.concurrency = 2, .queue_capacity = 2, .inputs = {"cache.miss"}});
  std::string last = "teacher";
  for (int k = 1; k < partitions; ++k) {
    p.add<TeacherPartitionStage>("teacher/partition" + std::to_string(k), {options, k},
                                 {.queue_capacity = 2, .inputs = {last}});
    last = "teacher/partition" + std::to_string(k);
  }
  p.add("merge", std::make_unique<MergeStage>(), {.inputs = {"cache.hit", last}});
  p.add("sink", seen.sink());
  return p.run({.threads = 2});
}

float half(float v) { return static_cast<float>(c10::Half(v)); }

// A cache file of TeacherOutputCache itself, without a graph: 20 logits per view.
TeacherOutputCache::Options cache_options(const std::string& path) {
  TeacherOutputCache::Options options;
  options.path = path;
  options.fingerprint = {1, 2, "teacher t.pt (1), data recipe 2"};
  return options;
}

ViewDigest key_of(int view) {
  return {0x5eed0000ULL + static_cast<std::uint64_t>(view), 7919ULL * (view + 1)};
}

std::vector<ViewDigest> keys_of(int first, int count) {
  std::vector<ViewDigest> keys;
  for (int v = first; v < first + count; ++v) keys.push_back(key_of(v));
  return keys;
}

bool all_are(const std::vector<TeacherOutputCache::Lookup>& found,
             TeacherOutputCache::Lookup what) {
  return std::all_of(found.begin(), found.end(), [&](auto f) { return f == what; });
}

float logit_of(int view, int c) { return 0.01f * static_cast<float>(view * 20 + c) - 1.f; }

// Stores `records` records of 4 views each (record k holds views 4k .. 4k + 3), as a run does.
void write_records(const std::string& path, int records) {
  TeacherOutputCache cache(cache_options(path));
  for (int k = 0; k < records; ++k) {
    const std::vector<ViewDigest> keys = keys_of(4 * k, 4);
    REQUIRE(all_are(cache.lookup(keys), TeacherOutputCache::Lookup::kCompute));
    std::vector<float> logits;
    for (int v = 4 * k; v < 4 * k + 4; ++v) {
      for (int c = 0; c < 20; ++c) logits.push_back(logit_of(v, c));
    }
    cache.store(keys, logits.data(), 20, nullptr, 0, 0.01);
  }
}

// Each record of write_records: 16 bytes of header, 4 x (16 + 40) of entries, 8 of checksum,
// after the file's header (64 bytes and the fingerprint's text).
constexpr std::size_t kRecordBytes = 16 + 4 * (16 + 40) + 8;
std::size_t first_record_at() { return 64 + cache_options("").fingerprint.text.size(); }

void flip_byte(const std::string& path, std::size_t at) {
  std::fstream file(path, std::ios::binary | std::ios::in | std::ios::out);
  file.seekg(static_cast<std::streamoff>(at));
  const char byte = static_cast<char>(file.get() ^ 0x40);
  file.seekp(static_cast<std::streamoff>(at));
  file.put(byte);
}

}  // namespace

TEST_CASE("Train.TeacherCache.EntriesRoundTripInFloat16") {
  const EntryFormat format{20, 0, 1, EntryFormat::Dtype::kFloat16};
  CHECK(format.payload_bytes() == 42);  // 20 logits and 1 regression output, 2 bytes each
  std::vector<float> logits(20), back(20);
  for (int c = 0; c < 20; ++c) logits[c] = 0.37f * static_cast<float>(c) - 3.1f;
  const float regression = 4.321f;
  float regression_back = 0;
  std::vector<std::uint8_t> bytes(format.payload_bytes());
  encode_outputs(format, logits.data(), &regression, bytes.data());
  decode_outputs(format, bytes.data(), back.data(), &regression_back);
  for (int c = 0; c < 20; ++c) CHECK(back[c] == half(logits[c]));
  CHECK(regression_back == half(regression));
}

TEST_CASE("Train.TeacherCache.TopKKeepsTheLargestAndTheRestsMass") {
  // 200 classes, the top 10 kept: they come back as stored, and the other 190 share the
  // softmax mass they had (at temperature 1), within float16 rounding.
  const EntryFormat format{200, 10, 0, EntryFormat::Dtype::kFloat16};
  CHECK(format.payload_bytes() == 10 * 6 + 2);
  std::vector<float> logits(200), back(200);
  for (int c = 0; c < 200; ++c) logits[c] = std::sin(0.7f * static_cast<float>(c)) * 4;
  std::vector<std::uint8_t> bytes(format.payload_bytes());
  encode_outputs(format, logits.data(), nullptr, bytes.data());
  decode_outputs(format, bytes.data(), back.data(), nullptr);
  std::vector<int> order(200);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  double rest = 0, rest_back = 0, top_back = 0;
  for (int j = 0; j < 200; ++j) {
    const int c = order[j];
    if (j < 10) {
      CHECK(back[c] == half(logits[c]));
      top_back += std::exp(back[c]);
    } else {
      rest += std::exp(logits[c]);
      rest_back += std::exp(back[c]);
    }
  }
  CHECK(rest_back == doctest::Approx(rest).epsilon(0.002));
  CHECK(top_back > 0);
}

TEST_CASE("Train.TeacherCache.SecondRunRunsNoTeacherAndGetsTheSameOutputs" *
          doctest::timeout(120)) {
  TempDir dir("cache");
  write_teacher(dir / "teacher.pt", 1);
  const TeacherCacheOptions options{.path = dir / "views.ftc", .model = dir / "teacher.pt"};

  SeenBatches first;
  const RunReport one = run_cached(first, options, dir / "teacher.pt", 6);
  CHECK(results_of(one, "cache")["misses"] == 48);
  CHECK(results_of(one, "cache")["hits"] == 0);
  CHECK(results_of(one, "teacher")["images"] == 48);
  CHECK(results_of(one, "cache")["entries"] == 48);
  // 16 bytes of view digest and 42 of outputs per view, plus a record header per batch.
  CHECK(results_of(one, "cache")["bytes_per_view"] < 70);

  // The stored outputs are the teacher's, rounded to float16, and the first run trains on them.
  std::unique_ptr<InferenceModel> teacher = InferenceModel::load(dir / "teacher.pt");
  for (auto& [n, batch] : first.batches) {
    const ModelOutput out = teacher->forward(batch.images);
    CHECK(torch::equal(batch.teacher_logits, out.logits.to(torch::kHalf).to(torch::kFloat)));
    CHECK(
        torch::equal(batch.teacher_regression, out.regression.to(torch::kHalf).to(torch::kFloat)));
  }

  SeenBatches second;
  const RunReport two = run_cached(second, options, dir / "teacher.pt", 6);
  CHECK(results_of(two, "cache")["hits"] == 48);
  CHECK(results_of(two, "cache")["misses"] == 0);
  CHECK(results_of(two, "teacher")["images"] == 0);  // no teacher forward at all
  CHECK(results_of(two, "cache")["saved_s"] > 0);
  REQUIRE(second.batches.size() == 6);
  for (auto& [n, batch] : second.batches) {
    CHECK(torch::equal(batch.teacher_logits, first.batches[n].teacher_logits));
    CHECK(torch::equal(batch.teacher_regression, first.batches[n].teacher_regression));
  }
}

TEST_CASE("Train.TeacherCache.ViewsRepeatedInARunAreComputedOnce" * doctest::timeout(120)) {
  // Batches 0-2 show new views; 3-8 repeat them (batch n shows batch n % 3's), some while the
  // batch that computes them is still in the teacher: they wait for it, in any timing.
  TempDir dir("cache");
  write_teacher(dir / "teacher.pt", 1);
  const TeacherCacheOptions options{.path = dir / "views.ftc", .model = dir / "teacher.pt"};
  SeenBatches seen;
  const RunReport report =
      run_cached(seen, options, dir / "teacher.pt", 9, [](int n) { return n % 3; });
  CHECK(results_of(report, "cache")["misses"] == 24);
  CHECK(results_of(report, "cache")["hits"] == 48);
  CHECK(results_of(report, "teacher")["images"] == 24);
  REQUIRE(seen.batches.size() == 9);
  for (std::uint64_t n = 3; n < 9; ++n) {
    CHECK(torch::equal(seen.batches[n].teacher_logits, seen.batches[n % 3].teacher_logits));
  }
}

TEST_CASE("Train.TeacherCache.ATornWriteLosesOnlyItsRecord" * doctest::timeout(120)) {
  // A run killed while writing leaves a prefix of its last record. Whatever the cut, the next
  // open keeps the whole records before it, with their exact outputs, and cuts the rest off.
  TempDir dir("cache");
  write_teacher(dir / "teacher.pt", 1);
  const std::string path = dir / "views.ftc";
  const TeacherCacheOptions options{.path = path, .model = dir / "teacher.pt"};
  SeenBatches first;
  run_cached(first, options, dir / "teacher.pt", 3);
  const auto whole = std::filesystem::file_size(path);
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Each record: 16 bytes of header, 8 x (16 + 42) bytes of entries, 8 bytes of checksum.
  const std::size_t record_bytes = 16 + 8 * (16 + 42) + 8;
  for (const std::size_t cut :
       {std::size_t{1}, std::size_t{16}, record_bytes / 2, record_bytes - 1}) {
    CAPTURE(cut);
    std::ofstream(path, std::ios::binary | std::ios::trunc)
        .write(bytes.data(), static_cast<std::streamsize>(whole - cut));
    SeenBatches again;
    const RunReport report = run_cached(again, options, dir / "teacher.pt", 3);
    CHECK(results_of(report, "cache")["torn_bytes_cut"] == record_bytes - cut);
    CHECK(results_of(report, "cache")["hits"] == 16);
    CHECK(results_of(report, "cache")["misses"] == 8);
    for (std::uint64_t n = 0; n < 3; ++n) {
      CHECK(torch::equal(again.batches[n].teacher_logits, first.batches[n].teacher_logits));
    }
  }
  // A damaged byte inside the last record: its checksum fails, and it is computed again.
  std::string damaged = bytes;
  damaged[whole - record_bytes / 2] ^= 0x40;
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(damaged.data(), static_cast<std::streamsize>(damaged.size()));
  SeenBatches again;
  const RunReport report = run_cached(again, options, dir / "teacher.pt", 3);
  CHECK(results_of(report, "cache")["misses"] == 8);
  CHECK(torch::equal(again.batches[2].teacher_logits, first.batches[2].teacher_logits));
}

// Autotune's rehearsals (throwaway copies of a run) use what the cache holds but never create,
// lock or change its file: their new entries stay in memory.
TEST_CASE("Train.TeacherCache.ARehearsalReadsTheFileAndChangesNothing" * doctest::timeout(120)) {
  TempDir dir("cache");
  write_teacher(dir / "teacher.pt", 1);
  const std::string path = dir / "views.ftc";
  const TeacherCacheOptions options{.path = path, .model = dir / "teacher.pt"};
  BuildContext rehearsal;
  rehearsal.set_rehearsal(true);
  const auto same_views = [](int n) { return n; };
  SeenBatches cold;
  RunReport report = run_cached(cold, options, dir / "teacher.pt", 3, same_views, rehearsal);
  CHECK(results_of(report, "cache")["misses"] == 24);
  // Nothing beside the teacher: no cache file, no lock.
  CHECK(std::distance(std::filesystem::directory_iterator(dir.path()),
                      std::filesystem::directory_iterator()) == 1);

  SeenBatches first;
  run_cached(first, options, dir / "teacher.pt", 2);
  const auto size = std::filesystem::file_size(path);
  const auto written = std::filesystem::last_write_time(path);
  SeenBatches rehearsed;
  report = run_cached(rehearsed, options, dir / "teacher.pt", 3, same_views, rehearsal);
  CHECK(results_of(report, "cache")["hits"] == 16);  // what the file holds
  CHECK(results_of(report, "cache")["misses"] == 8);
  for (std::uint64_t n = 0; n < 2; ++n) {
    CHECK(torch::equal(rehearsed.batches[n].teacher_logits, first.batches[n].teacher_logits));
  }
  CHECK(torch::equal(rehearsed.batches[2].teacher_logits, cold.batches[2].teacher_logits));
  CHECK(std::filesystem::file_size(path) == size);
  CHECK(std::filesystem::last_write_time(path) == written);
  SeenBatches after;
  report = run_cached(after, options, dir / "teacher.pt", 3);
  CHECK(results_of(report, "cache")["misses"] == 8);  // the rehearsal stored nothing
}

TEST_CASE("Train.TeacherCache.AnotherTeacherIsOneLineUnlessReplaced" * doctest::timeout(120)) {
  TempDir dir("cache");
  write_teacher(dir / "teacher.pt", 1);
  write_teacher(dir / "other.pt", 2);
  TeacherCacheOptions options{.path = dir / "views.ftc", .model = dir / "teacher.pt"};
  SeenBatches first;
  run_cached(first, options, dir / "teacher.pt", 2);

  options.model = dir / "other.pt";
  SeenBatches other;
  CHECK_THROWS_WITH_AS(run_cached(other, options, dir / "other.pt", 2),
                       doctest::Contains("views.ftc was filled by another teacher (it holds: "
                                         "teacher "),
                       StageError);
  options.on_mismatch = OnCacheMismatch::kReplace;
  const RunReport replaced = run_cached(other, options, dir / "other.pt", 2);
  CHECK(results_of(replaced, "cache")["misses"] == 16);
  CHECK_FALSE(torch::equal(other.batches[0].teacher_logits, first.batches[0].teacher_logits));

  // teacher_infer running another model than the one the cache names is refused too, before
  // the run (TeacherInferOfAnotherModelIsRefusedBeforeTheRun).
  options.path = dir / "crossed.ftc";
  SeenBatches crossed;
  CHECK_THROWS_WITH_AS(run_cached(crossed, options, dir / "teacher.pt", 2),
                       doctest::Contains("stage 'teacher': runs the teacher "), Error);
  CHECK_FALSE(std::filesystem::exists(dir / "crossed.ftc"));
}

// A teacher in partition nodes fills the cache with the whole teacher's outputs, bit for bit,
// also for batches that wait for views another batch is computing.
TEST_CASE("Train.TeacherCache.APartitionedTeacherFillsItAsTheWholeOneDoes" *
          doctest::timeout(120)) {
  TempDir dir("cache");
  write_teacher(dir / "teacher.pt", 1, 3);
  const auto view_of = [](int n) { return n % 3; };
  SeenBatches whole, parts;
  const RunReport one = run_cached(whole, {.path = dir / "whole.ftc", .model = dir / "teacher.pt"},
                                   dir / "teacher.pt", 9, view_of);
  const RunReport three =
      run_cached(parts, {.path = dir / "parts.ftc", .model = dir / "teacher.pt"},
                 dir / "teacher.pt", 9, view_of, {}, 3);
  CHECK(results_of(three, "cache")["misses"] == results_of(one, "cache")["misses"]);
  CHECK(results_of(three, "teacher/partition2")["images"] == 24);
  REQUIRE(parts.batches.size() == 9);
  for (auto& [n, batch] : parts.batches) {
    CHECK(torch::equal(batch.teacher_logits, whole.batches[n].teacher_logits));
    CHECK(torch::equal(batch.teacher_regression, whole.batches[n].teacher_regression));
    CHECK_FALSE(batch.teacher_activation.defined());
  }
}

// Another process (a truncate, a copy over the file) cuts the file short while a run reads
// it: the run fails with one line naming the file, never SIGBUS; the next run recomputes.
TEST_CASE("Train.TeacherCache.AFileCutShortDuringTheRunIsOneLine" * doctest::timeout(60)) {
  TempDir dir("cache");
  const std::string path = dir / "views.ftc";
  write_records(path, 3);
  const std::vector<ViewDigest> keys = keys_of(0, 12);
  {
    TeacherOutputCache cache(cache_options(path));
    REQUIRE(all_are(cache.lookup(keys), TeacherOutputCache::Lookup::kHit));
    std::vector<std::uint8_t> out;
    cache.entry(key_of(5), out);
    std::vector<float> logits(20);
    decode_outputs(*cache.format(), out.data(), logits.data(), nullptr);
    CHECK(logits[3] == half(logit_of(5, 3)));

    const std::string changed =
        path + ": the teacher cache was cut short or rewritten by another process";
    // Rewritten in place (here: zeros of the same length): the entries read back wrong.
    const auto size = std::filesystem::file_size(path);
    REQUIRE(::truncate(path.c_str(), 0) == 0);
    REQUIRE(::truncate(path.c_str(), static_cast<off_t>(size)) == 0);
    CHECK_THROWS_WITH_AS(cache.entry(key_of(11), out), doctest::Contains(changed.c_str()), Error);
    // Cut short: the entries are past its end.
    REQUIRE(::truncate(path.c_str(), 0) == 0);
    for (const int view : {0, 5, 11}) {
      CAPTURE(view);
      CHECK_THROWS_WITH_AS(cache.entry(key_of(view), out), doctest::Contains(changed.c_str()),
                           Error);
    }
  }
  TeacherOutputCache again(cache_options(path));
  CHECK(all_are(again.lookup(keys), TeacherOutputCache::Lookup::kCompute));
}

// A flipped byte costs the record it is in, not the intact records after it; whatever was
// damaged (outputs or the record's count of entries), the next record is found again.
TEST_CASE("Train.TeacherCache.ADamagedRecordCostsItsOwnEntriesOnly" * doctest::timeout(60)) {
  TempDir dir("cache");
  const std::string path = dir / "views.ftc";
  using Lookup = TeacherOutputCache::Lookup;
  struct Damage {
    const char* what;
    int record;
    std::size_t offset;  // in the record
  };
  for (const Damage damage : {Damage{"the outputs of record 0's first view", 0, 16 + 16 + 3},
                              Damage{"record 1's count of entries", 1, 4}}) {
    CAPTURE(damage.what);
    std::filesystem::remove(path);
    write_records(path, 4);
    flip_byte(path, first_record_at() + damage.record * kRecordBytes + damage.offset);
    {
      TeacherOutputCache cache(cache_options(path));
      const std::vector<Lookup> found = cache.lookup(keys_of(0, 16));
      for (int v = 0; v < 16; ++v) {
        CAPTURE(v);
        CHECK(found[v] == (v / 4 == damage.record ? Lookup::kCompute : Lookup::kHit));
      }
      CHECK(cache.stats().damaged_bytes == kRecordBytes);
      CHECK(cache.stats().dropped_bytes == 0);
      CHECK(cache.stats().entries == 12);
      const int intact = damage.record == 0 ? 15 : 0;
      std::vector<std::uint8_t> out;
      cache.entry(key_of(intact), out);
      std::vector<float> logits(20);
      decode_outputs(*cache.format(), out.data(), logits.data(), nullptr);
      for (int c = 0; c < 20; ++c) CHECK(logits[c] == half(logit_of(intact, c)));
      // The damaged record's views are computed again and appended.
      std::vector<float> again;
      for (int v = 4 * damage.record; v < 4 * damage.record + 4; ++v) {
        for (int c = 0; c < 20; ++c) again.push_back(logit_of(v, c));
      }
      cache.store(keys_of(4 * damage.record, 4), again.data(), 20, nullptr, 0, 0.01);
    }
    TeacherOutputCache reopened(cache_options(path));
    CHECK(all_are(reopened.lookup(keys_of(0, 16)), Lookup::kHit));
  }
}

// teacher_infer behind a teacher_cache keyed by another teacher: refused when the graph is
// wired, before any batch (a warm cache would never ask teacher_infer; a half-warm one would
// mix two teachers' outputs).
TEST_CASE("Train.TeacherCache.TeacherInferOfAnotherModelIsRefusedBeforeTheRun" *
          doctest::timeout(120)) {
  TempDir dir("cache");
  write_teacher(dir / "a.pt", 1);
  write_teacher(dir / "b.pt", 2);
  const auto config = [&](const std::string& infer_params) {
    return parse_pipeline_config(
        "threads: 2\ncores: 2\nstages:\n" + data_stages("train", 1, true) +
            "  - {type: teacher_cache, params: {path: " + dir / "views.ftc" +
            ", model: " + dir / "a.pt" +
            "}}\n"
            "  - {type: teacher_infer, inputs: teacher_cache.miss, params: {intraop_threads: 1, " +
            infer_params +
            "}}\n"
            "  - {type: merge, inputs: [teacher_cache.hit, teacher_infer]}\n"
            "  - {type: student_step, params: {classes: 20, regression_outputs: 1, image_size: 32, "
            "patch_size: 8, dim: 32, depth: 1, heads: 2}}\n",
        "kd.yaml");
  };
  const PipelineConfig other = config("model: " + dir / "b.pt");
  const std::string both = "stage 'teacher_infer': runs the teacher " + dir / "b.pt" +
                           ", but the teacher_cache it takes batches from keys its entries by " +
                           dir / "a.pt" + ": give both the same model and autocast";
  CHECK_THROWS_WITH_AS(build_pipeline(other)->run(other.run), doctest::Contains(both.c_str()),
                       Error);
  CHECK_FALSE(std::filesystem::exists(dir / "views.ftc"));  // nothing ran
  const PipelineConfig bf16 = config("model: " + dir / "a.pt" + ", autocast: bf16");
  const std::string autocast = "runs the teacher " + dir / "a.pt" + " (autocast bf16), but";
  CHECK_THROWS_WITH_AS(build_pipeline(bf16)->check(), doctest::Contains(autocast.c_str()), Error);
  const PipelineConfig same = config("model: " + dir / "a.pt");
  CHECK_NOTHROW(build_pipeline(same)->check());
}
