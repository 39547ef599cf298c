#include <doctest/doctest.h>
#include <stdlib.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <numeric>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <set>

#include "graph/config.hpp"
#include "graph/error.hpp"
#include "graph/pipeline.hpp"
#include "graph/registry.hpp"
#include "stages/data/sample.hpp"
#include "stages/data/sources/class_medians.hpp"
#include "stages/data/sources/csv_source.hpp"
#include "stages/data/sources/epoch_order.hpp"
#include "stages/data/sources/image_folder_source.hpp"
#include "stages/data/sources/shard.hpp"
#include "stages/data/sources/shard_source.hpp"
#include "tests/data/declared_size.hpp"
#include "tests/temp_dir.hpp"
#include "tests/test_stages.hpp"

using namespace flowtrain;
using namespace flowtrain::data;
using namespace flowtrain::testing;
namespace fs = std::filesystem;

namespace {

using flowtrain::testing::TempDir;

void write_file(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

void write_file(const fs::path& path, const std::vector<std::uint8_t>& bytes) {
  write_file(path, std::string(bytes.begin(), bytes.end()));
}

std::vector<std::uint8_t> read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<std::uint8_t> as_bytes(const std::string& s) { return {s.begin(), s.end()}; }

// A real JPEG of width x height with content varying by `seed`.
std::vector<std::uint8_t> make_jpeg(int width, int height, int seed) {
  cv::Mat image(height, width, CV_8UC3);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      image.at<cv::Vec3b>(y, x) = cv::Vec3b(static_cast<std::uint8_t>(x * 3 + seed),
                                            static_cast<std::uint8_t>(y * 5 + seed * 7),
                                            static_cast<std::uint8_t>((x ^ y) + seed));
    }
  }
  std::vector<std::uint8_t> out;
  REQUIRE(cv::imencode(".jpg", image, out));
  return out;
}

// The error message of `fn`, which must throw flowtrain::Error.
template <class Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  FAIL("no flowtrain::Error thrown");
  return {};
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The global order of one epoch rebuilt from every rank's indices: rank r's k-th index is at
// position r + k * world_size (split: the ranks' counts differ, the positions run 0 .. n-1).
std::vector<std::uint64_t> global_order(std::size_t n,
                                        std::size_t world,
                                        Uneven uneven,
                                        bool shuffle,
                                        std::uint64_t seed,
                                        std::uint32_t epoch) {
  std::vector<std::vector<std::uint64_t>> ranks;
  for (std::size_t r = 0; r < world; ++r) {
    const EpochOrder order(
        n, {.seed = seed, .shuffle = shuffle, .rank = r, .world_size = world, .uneven = uneven});
    ranks.push_back(order.indices(epoch));
    REQUIRE(ranks.back().size() == order.per_rank());
    if (uneven != Uneven::kSplit) {
      REQUIRE(ranks.back().size() == ranks.front().size());  // equal counts per rank
    } else {  // the first n % world ranks get one more
      REQUIRE(ranks.back().size() == n / world + (r < n % world ? 1 : 0));
    }
  }
  std::size_t total = 0;
  for (const auto& indices : ranks) total += indices.size();
  std::vector<std::uint64_t> out(total);
  for (std::size_t r = 0; r < world; ++r) {
    for (std::size_t k = 0; k < ranks[r].size(); ++k) out[r + k * world] = ranks[r][k];
  }
  return out;
}

// A small dataset in three forms for the source tests: root/<class>/<file> with arbitrary bytes,
// a CSV manifest of the same files with one target, and a shard of the same records.
struct SourceFixture {
  static constexpr std::size_t kCount = 10;
  TempDir dir;
  std::string root = (dir / "images").string();
  std::string manifest = (dir / "manifest.csv").string();
  std::string shard = (dir / "data.ftpk").string();
  std::vector<std::string> paths;  // by dataset index

  SourceFixture() {
    const char* classes[] = {"apple", "banana", "cherry"};
    std::string csv = "path,label,energy_kcal\n";
    ShardWriter writer(shard);
    for (std::size_t i = 0; i < kCount; ++i) {
      const std::size_t label = i * 3 / kCount;  // 4, 3, 3 files: sorted order = index order
      const std::string rel =
          std::string("images/") + classes[label] + "/img" + std::to_string(i) + ".jpg";
      const std::string bytes = "bytes of image " + std::to_string(i);
      write_file(dir / rel, bytes);
      paths.push_back((dir / rel).string());
      csv += rel + "," + std::to_string(label) + "," + std::to_string(i * 10) + ".5\n";
      const float target = static_cast<float>(i * 10) + 0.5f;
      writer.add(as_bytes(bytes), static_cast<std::int64_t>(label), {&target, 1}, paths.back());
    }
    writer.finish();
    write_file(manifest, csv);
  }

  std::string location_param(const std::string& type) const {
    return type == "image_folder" ? "root" : type == "csv_manifest" ? "manifest" : "shard";
  }
  std::string location(const std::string& type) const {
    return type == "image_folder" ? root : type == "csv_manifest" ? manifest : shard;
  }
};

constexpr const char* kSourceTypes[] = {"image_folder", "csv_manifest", "shard"};

// Builds the source `type` of the dataset at `location` (empty: none given) with `source`, in a
// run that `context` describes.
std::unique_ptr<Stage> make_stage(const std::string& type,
                                  const std::string& location,
                                  const SourceOptions& source = {},
                                  const BuildContext& context = {}) {
  if (type == "image_folder") {
    return std::make_unique<ImageFolderSource>(
        ImageFolderSource::Options{.root = location, .source = source}, context);
  }
  if (type == "csv_manifest") {
    return std::make_unique<CsvManifestSource>(
        CsvManifestSource::Options{.manifest = location, .source = source}, context);
  }
  REQUIRE(type == "shard");
  return std::make_unique<ShardSource>(ShardSource::Options{.shard = location, .source = source},
                                       context);
}

std::unique_ptr<Stage> make_source(const SourceFixture& f,
                                   const std::string& type,
                                   const SourceOptions& source = {}) {
  return make_stage(type, f.location(type), source);
}

// Runs `source` into a sink with two workers; returns what the sink got, in sequence order.
std::vector<Sample> run_source(std::unique_ptr<Stage> source) {
  std::mutex mutex;
  std::vector<std::pair<std::uint64_t, Sample>> got;
  Pipeline p;
  p.add("source", std::move(source));
  p.add("sink", std::make_unique<ProbeSink<Sample>>([&](Sample&& s, ItemContext& ctx) {
          std::lock_guard lock(mutex);
          got.emplace_back(ctx.seq(), std::move(s));
        }),
        {.concurrency = 2, .queue_capacity = 8});
  const RunReport report = p.run({.threads = 2});
  CHECK(report.stages[1].items_in == got.size());
  std::sort(got.begin(), got.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<Sample> out;
  for (auto& [seq, sample] : got) out.push_back(std::move(sample));
  return out;
}

}  // namespace

// ------------------------------------------------------------------------------- EpochOrder

TEST_CASE("Data.Dataset.EpochOrderEachSampleOncePerEpochAcrossRanks") {
  for (const std::size_t n : {1, 2, 5, 6, 7, 10, 13}) {
    for (const std::size_t world : {1, 2, 3}) {
      for (const Uneven uneven : {Uneven::kPad, Uneven::kDrop, Uneven::kSplit}) {
        for (const bool shuffle : {true, false}) {
          for (std::uint32_t epoch = 0; epoch < 3; ++epoch) {
            CAPTURE(n);
            CAPTURE(world);
            CAPTURE(static_cast<int>(uneven));
            CAPTURE(shuffle);
            CAPTURE(epoch);
            const std::vector<std::uint64_t> order =
                global_order(n, world, uneven, shuffle, 42, epoch);
            if (uneven == Uneven::kPad) {
              REQUIRE(order.size() == world * ((n + world - 1) / world));
              // The first n positions are a permutation; the rest repeat the order's start.
              std::vector<std::uint64_t> head(order.begin(), order.begin() + n);
              std::sort(head.begin(), head.end());
              std::vector<std::uint64_t> all(n);
              std::iota(all.begin(), all.end(), 0);
              CHECK(head == all);
              for (std::size_t j = n; j < order.size(); ++j) CHECK(order[j] == order[j - n]);
            } else if (uneven == Uneven::kSplit) {  // a permutation: every sample once
              std::vector<std::uint64_t> sorted = order, all(n);
              std::sort(sorted.begin(), sorted.end());
              std::iota(all.begin(), all.end(), 0);
              CHECK(sorted == all);
            } else {
              REQUIRE(order.size() == world * (n / world));
              const std::set<std::uint64_t> distinct(order.begin(), order.end());
              CHECK(distinct.size() == order.size());
              for (const std::uint64_t i : order) CHECK(i < n);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("Data.Dataset.EpochOrderMoreRanksThanSamples") {
  // pad: every rank still gets a sample; drop: no rank gets any.
  CHECK(global_order(2, 3, Uneven::kPad, true, 0, 0).size() == 3);
  const EpochOrder drop(2, {.rank = 2, .world_size = 3, .uneven = Uneven::kDrop});
  CHECK(drop.indices(0).empty());
  // split: the first two ranks get one each, the third none.
  CHECK(global_order(2, 3, Uneven::kSplit, true, 0, 0).size() == 2);
  CHECK(EpochOrder(2, {.rank = 2, .world_size = 3, .uneven = Uneven::kSplit}).indices(0).empty());
  const EpochOrder empty(0, {.world_size = 2});
  CHECK(empty.indices(0).empty());
}

TEST_CASE("Data.Dataset.ShuffleDeterministicFromSeedAndEpoch") {
  const EpochOrder a(100, {.seed = 7});
  const EpochOrder b(100, {.seed = 7});
  const EpochOrder other_seed(100, {.seed = 8});
  for (std::uint32_t epoch = 0; epoch < 4; ++epoch) CHECK(a.indices(epoch) == b.indices(epoch));
  CHECK(a.indices(0) != a.indices(1));
  CHECK(a.indices(1) != a.indices(2));
  CHECK(a.indices(0) != other_seed.indices(0));

  std::vector<std::uint64_t> identity(100);
  std::iota(identity.begin(), identity.end(), 0);
  CHECK(a.indices(0) != identity);
  std::vector<std::uint64_t> sorted = a.indices(0);
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted == identity);
  CHECK(EpochOrder(100, {.seed = 7, .shuffle = false}).indices(3) == identity);

  // Pinned: a change here reorders every existing run (the generator is mt19937_64 seeded with
  // seed + epoch and an unbiased rejection draw, defined the same by every standard library).
  CHECK(EpochOrder(10, {.seed = 0}).indices(0) ==
        std::vector<std::uint64_t>{7, 2, 0, 8, 3, 9, 6, 1, 5, 4});
}

TEST_CASE("Data.Dataset.EpochOrderRejectsBadRank") {
  CHECK(contains(error_of([] { EpochOrder(10, {.rank = 2, .world_size = 2}); }),
                 "rank 2 must be below world_size 2"));
  CHECK_THROWS_AS(EpochOrder(10, {.world_size = 0}), Error);
  CHECK(enum_value<Uneven>("pad", "param 'uneven'") == Uneven::kPad);
  CHECK(enum_value<Uneven>("drop", "param 'uneven'") == Uneven::kDrop);
  CHECK(enum_value<Uneven>("split", "param 'uneven'") == Uneven::kSplit);
  CHECK(error_of([] { enum_value<Uneven>("even", "param 'uneven'"); }) ==
        "param 'uneven' must be one of pad, drop, split, got 'even'");
}

// ------------------------------------------------------------------------------ EpochCursor

namespace {

// A job on `worlds[0]` ranks that each take `takes[0]` items, resumed on `worlds[1]` ranks at
// the shared position they reached, which take `takes[1]`, and so on (the last: to the end).
// Returns the dataset indices each epoch saw, over all ranks and all parts of the job.
std::vector<std::multiset<std::uint64_t>> resized_job(std::size_t n,
                                                      Uneven uneven,
                                                      const std::vector<std::size_t>& worlds,
                                                      const std::vector<std::uint64_t>& takes) {
  constexpr std::uint32_t kEpochs = 3;
  std::vector<std::multiset<std::uint64_t>> seen(kEpochs);
  std::uint64_t shared = 0;
  for (std::size_t part = 0; part < worlds.size(); ++part) {
    const bool last = part + 1 == worlds.size();
    std::optional<std::uint64_t> reached;
    std::uint64_t planned = 0;
    for (std::size_t rank = 0; rank < worlds[part]; ++rank) {
      EpochCursor cursor(
          n, {.epochs = kEpochs,
              .order = {.seed = 5, .rank = rank, .world_size = worlds[part], .uneven = uneven}});
      REQUIRE(cursor.seek_shared(shared));
      const std::uint64_t begin = cursor.ordinal();
      // Every rank of a part plans the same count.
      if (rank == 0) planned = cursor.total() - begin;
      CHECK(cursor.total() - begin == planned);
      std::uint64_t taken = 0;
      while (last || taken < takes[part]) {
        const std::optional<EpochCursor::Position> at = cursor.next();
        if (!at) break;
        seen[at->epoch].insert(at->index);
        ++taken;
      }
      if (last) CHECK(cursor.ordinal() == cursor.total());
      // Where the ranks stand in the shared order: the same on every one.
      const std::optional<std::uint64_t> position = cursor.shared_position(begin + taken);
      REQUIRE(position.has_value());
      if (reached) CHECK(*position == *reached);
      reached = position;
    }
    shared = *reached;
  }
  CHECK(shared == kEpochs * n);  // the job ran to the end of its last epoch
  return seen;
}

}  // namespace

// A job resumed on another number of ranks takes up the epoch where its ranks stood in the
// order they share: within the epoch no sample is seen twice or skipped, beyond what pad
// (repeats, fewer than a rank count) and drop (a tail shorter than a rank count left out) do
// to any epoch; resized twice as well. On the same number of ranks, a shared-position resume
// is the ordinal seek: the same indices, epochs and ordinals.
TEST_CASE("Data.Dataset.EpochCursorResumedOnAnotherNumberOfRanks") {
  for (const std::size_t n : {10, 11, 12}) {
    for (const Uneven uneven : {Uneven::kPad, Uneven::kDrop}) {
      for (const std::vector<std::size_t>& worlds : std::vector<std::vector<std::size_t>>{
               {2, 1}, {1, 2}, {2, 3}, {3, 2}, {4, 3}, {2, 3, 1}, {3, 1, 2}}) {
        for (std::uint64_t take = 0; take < 12; take += 1) {
          CAPTURE(n);
          CAPTURE(static_cast<int>(uneven));
          CAPTURE(worlds.size());
          CAPTURE(worlds[0]);
          CAPTURE(worlds[1]);
          CAPTURE(take);
          // Stops mid-epoch, at an epoch's end, and in the next epoch.
          const std::vector<std::multiset<std::uint64_t>> seen =
              resized_job(n, uneven, worlds, std::vector<std::uint64_t>(worlds.size(), take));
          for (const std::multiset<std::uint64_t>& epoch : seen) {
            const std::set<std::uint64_t> distinct(epoch.begin(), epoch.end());
            for (const std::uint64_t i : distinct) CHECK(i < n);
            if (uneven == Uneven::kPad) {
              CHECK(distinct.size() == n);  // none skipped
              CHECK(epoch.size() - n < 4);  // repeats: padding only
            } else {
              CHECK(distinct.size() == epoch.size());  // none twice
              CHECK(n - epoch.size() < 4);             // left out: a tail only
            }
          }
        }
      }
    }
  }
  // The same number of ranks: seek_shared to where they stood is seek to their ordinal.
  for (const std::size_t world : {1, 2, 3}) {
    for (const Uneven uneven : {Uneven::kPad, Uneven::kDrop}) {
      for (std::uint64_t ordinal = 0; ordinal <= 3 * (11 / world + 1); ++ordinal) {
        CAPTURE(world);
        CAPTURE(ordinal);
        for (std::size_t rank = 0; rank < world; ++rank) {
          const SourcePlan options = {
              .epochs = 3,
              .order = {.seed = 8, .rank = rank, .world_size = world, .uneven = uneven}};
          EpochCursor by_ordinal(11, options);
          if (!by_ordinal.seek(ordinal)) break;
          const std::optional<std::uint64_t> shared = by_ordinal.shared_position(ordinal);
          REQUIRE(shared.has_value());
          EpochCursor by_shared(11, options);
          REQUIRE(by_shared.seek_shared(*shared));
          CHECK(by_shared.ordinal() == ordinal);
          CHECK(by_shared.total() == by_ordinal.total());
          while (const std::optional<EpochCursor::Position> a = by_ordinal.next()) {
            const std::optional<EpochCursor::Position> b = by_shared.next();
            REQUIRE(b.has_value());
            CHECK(b->index == a->index);
            CHECK(b->epoch == a->epoch);
            CHECK(by_shared.shared_position(by_shared.ordinal()) ==
                  by_ordinal.shared_position(by_ordinal.ordinal()));
          }
          CHECK_FALSE(by_shared.next().has_value());
        }
      }
    }
  }
  // Past the end: refused; split: its ranks' counts differ, so there is no shared position.
  EpochCursor cursor(10, {.epochs = 2});
  CHECK(cursor.seek_shared(20));
  CHECK_FALSE(cursor.seek_shared(21));
  CHECK_FALSE(EpochCursor(10, {.order = {.uneven = Uneven::kSplit}}).shared_position(3));
}

// ---------------------------------------------------------------------------- image folders

TEST_CASE("Data.Dataset.ScanImageFolderSortsClassesAndFiles") {
  TempDir dir;
  write_file(dir / "root/zebra/b.jpg", "z");
  write_file(dir / "root/zebra/a.JPEG", "z");
  write_file(dir / "root/ant/2.jpg", "a");
  write_file(dir / "root/ant/10.jpg", "a");
  write_file(dir / "root/ant/notes.txt", "not an image");
  write_file(dir / "root/ant/.hidden.jpg", "hidden");
  write_file(dir / "root/readme.jpg", "a file at the root is no class");
  fs::create_directories(dir / "root/empty");
  fs::create_directories(dir / "root/.cache/x");

  const ImageFolder folder = scan_image_folder((dir / "root").string());
  CHECK(folder.classes == std::vector<std::string>{"ant", "empty", "zebra"});
  REQUIRE(folder.entries.size() == 4);
  const std::string root = (dir / "root").string();
  CHECK(folder.entries[0].path == root + "/ant/10.jpg");  // byte order, not numeric
  CHECK(folder.entries[1].path == root + "/ant/2.jpg");
  CHECK(folder.entries[2].path == root + "/zebra/a.JPEG");
  CHECK(folder.entries[3].path == root + "/zebra/b.jpg");
  CHECK(folder.entries[0].label == 0);
  CHECK(folder.entries[1].label == 0);
  CHECK(folder.entries[2].label == 2);  // "empty" keeps label 1
  CHECK(folder.entries[3].label == 2);
  CHECK(folder.entries[0].targets.empty());

  CHECK(scan_image_folder(root, {"txt"}).entries.size() == 1);
  CHECK(scan_image_folder(root, {}).entries.size() == 5);  // every non-hidden file
}

TEST_CASE("Data.Dataset.ScanImageFolderErrors") {
  TempDir dir;
  const std::string missing = (dir / "missing").string();
  CHECK(error_of([&] { scan_image_folder(missing); }) == missing + ": no such folder");
  write_file(dir / "file.jpg", "x");
  CHECK(error_of([&] { scan_image_folder((dir / "file.jpg").string()); }) ==
        (dir / "file.jpg").string() + ": not a folder");
  fs::create_directories(dir / "flat");
  write_file(dir / "flat/a.jpg", "x");
  CHECK(contains(error_of([&] { scan_image_folder((dir / "flat").string()); }),
                 "flat: no class folders (expected "));
  write_file(dir / "pngs/cat/a.png", "x");
  CHECK(contains(error_of([&] { scan_image_folder((dir / "pngs").string()); }),
                 "pngs: no images with extension .jpeg, .jpg in its 1 class folders"));
}

// ----------------------------------------------------------------------------- CSV manifests

TEST_CASE("Data.Dataset.CsvManifestReadsRowsAndResolvesPaths") {
  TempDir dir;
  const std::string csv = (dir / "meta/food.csv").string();
  write_file(csv,
             "\xEF\xBB\xBFpath,label, energy_kcal ,protein_g\r\n"
             "img/a.jpg,3,250.5,12\r\n"
             "\r\n"
             "/abs/b.jpg,0,-1e2, 0.25\n"
             "\"img/with,comma \"\"q\"\".jpg\",,0,1\n"
             "../up.jpg,-1,1,2");  // no final newline
  const CsvManifest m = read_csv_manifest(csv);
  CHECK(m.target_names == std::vector<std::string>{"energy_kcal", "protein_g"});
  REQUIRE(m.entries.size() == 4);
  const std::string base = (dir / "meta").string();
  CHECK(m.entries[0].path == base + "/img/a.jpg");
  CHECK(m.entries[0].label == 3);
  CHECK(m.entries[0].targets == std::vector<float>{250.5f, 12.0f});
  CHECK(m.entries[1].path == "/abs/b.jpg");
  CHECK(m.entries[1].targets == std::vector<float>{-100.0f, 0.25f});
  CHECK(m.entries[2].path == base + "/img/with,comma \"q\".jpg");
  CHECK(m.entries[2].label == -1);
  CHECK(m.entries[3].path == (dir / "up.jpg").string());
  CHECK(m.entries[3].label == -1);
}

TEST_CASE("Data.Dataset.CsvErrorsNameFileLineAndColumn") {
  TempDir dir;
  const std::string csv = (dir / "m.csv").string();
  auto error_for = [&](const std::string& text) {
    write_file(csv, text);
    return error_of([&] { read_csv_manifest(csv); });
  };
  const std::string header = "path,label,energy_kcal\n";
  CHECK(error_for(header + "a.jpg,1,5\nb.jpg,one,5\n") ==
        csv +
            ":3: column 'label': 'one' is not a class id (an integer >= 0; -1 or empty for none)");
  CHECK(error_for(header + "a.jpg,1,5\n\nb.jpg,2,lots\n") ==
        csv + ":4: column 'energy_kcal': 'lots' is not a finite number");
  CHECK(error_for(header + "a.jpg,1,\n") ==
        csv + ":2: column 'energy_kcal': '' is not a finite number");
  CHECK(error_for(header + "a.jpg,1,nan\n") ==
        csv + ":2: column 'energy_kcal': 'nan' is not a finite number");
  CHECK(error_for(header + "a.jpg,1.5,5\n") ==
        csv +
            ":2: column 'label': '1.5' is not a class id (an integer >= 0; -1 or empty for none)");
  CHECK(error_for(header + "a.jpg,-2,5\n").starts_with(csv + ":2: column 'label': '-2'"));
  CHECK(error_for(header + ",1,5\n") == csv + ":2: column 'path': empty");
  CHECK(error_for(header + "a.jpg,1\n") ==
        csv + ":2: 2 columns, expected 3 (path,label,energy_kcal)");
  CHECK(error_for(header + "\"a.jpg,1,5\n") ==
        csv + ":2: column 1: unterminated quote");
  CHECK(error_for("file,class\na.jpg,1\n") ==
        csv + ":1: header must start with 'path,label', got 'file,class'");
  CHECK(error_for("path,label,x,x\n") == csv + ":1: header column 'x' appears twice");
  CHECK(error_for("") == csv + ": empty; expected a header row 'path,label[,target...]'");
  CHECK(error_for(header) == csv + ": no rows after the header");
  const std::string missing = (dir / "none.csv").string();
  CHECK(error_of([&] { read_csv_manifest(missing); }) == missing + ": cannot open (no such file)");
}

// ------------------------------------------------------------------------------------ shards

TEST_CASE("Data.Shard.WriteThenReadRoundTrip") {
  TempDir dir;
  const std::string path = (dir / "s.ftpk").string();
  std::vector<std::vector<std::uint8_t>> bytes;
  {
    ShardWriter writer(path);
    for (int i = 0; i < 5; ++i) {
      bytes.push_back(
          as_bytes(std::string(static_cast<std::size_t>(i * 7), static_cast<char>('a' + i))));
      const std::vector<float> targets{static_cast<float>(i), -static_cast<float>(i) / 3};
      writer.add(bytes.back(), i - 1, targets, "orig/" + std::to_string(i) + ".jpg");
    }
    CHECK(writer.size() == 5);
    writer.finish();
  }
  CHECK(!fs::exists(path + ".tmp"));
  const ShardReader reader(path);
  REQUIRE(reader.size() == 5);
  CHECK(reader.target_count() == 2);
  for (const std::size_t i : {3, 0, 4, 1, 2}) {  // any order: O(1) access
    CAPTURE(i);
    const ShardReader::Record r = reader.record(i);
    CHECK(std::vector<std::uint8_t>(r.bytes.begin(), r.bytes.end()) == bytes[i]);
    CHECK(r.label == static_cast<std::int64_t>(i) - 1);
    CHECK(std::vector<float>(r.targets.begin(), r.targets.end()) ==
          std::vector<float>{static_cast<float>(i), -static_cast<float>(i) / 3});
    CHECK(r.path == "orig/" + std::to_string(i) + ".jpg");
  }
  CHECK(contains(error_of([&] { reader.record(5); }), "record 5 out of range (5 records)"));
}

TEST_CASE("Data.Shard.PackThenReadReturnsSameRecords") {
  TempDir dir;
  std::vector<DatasetEntry> entries;
  for (int i = 0; i < 4; ++i) {
    const fs::path p = dir / ("img" + std::to_string(i) + ".jpg");
    write_file(p, make_jpeg(20 + i, 16, i));
    entries.push_back({p.string(), i % 2, {static_cast<float>(i) * 1.5f}});
  }
  write_file(dir / "text.jpg", "this is not a JPEG");
  entries.insert(entries.begin() + 1, {(dir / "text.jpg").string(), 1, {0}});
  entries.insert(entries.begin() + 3, {(dir / "missing.jpg").string(), 1, {0}});
  entries.push_back({(dir / "empty.jpg").string(), 0, {0}});
  write_file(dir / "empty.jpg", "");

  std::vector<std::size_t> progress;
  const std::string out = (dir / "packed.ftpk").string();
  const PackResult result = pack_dataset(entries, out, 0, [&](std::size_t done, std::size_t total) {
    CHECK(total == entries.size());
    progress.push_back(done);
  });
  CHECK(progress.size() == entries.size());
  CHECK(progress.back() == entries.size());
  CHECK(result.written == 4);
  CHECK(result.resized == 0);
  REQUIRE(result.skipped.size() == 3);
  CHECK(result.skipped[0].path == (dir / "text.jpg").string());
  CHECK(result.skipped[0].reason == "not an image (unknown format)");  // jpeg_decode's reason
  CHECK(result.skipped[1].path == (dir / "missing.jpg").string());
  CHECK(result.skipped[1].reason == "cannot open (No such file or directory)");
  CHECK(result.skipped[2].reason == "empty file");

  const ShardReader reader(out);
  REQUIRE(reader.size() == 4);
  CHECK(reader.target_count() == 1);
  for (std::size_t i = 0; i < 4; ++i) {
    CAPTURE(i);
    const fs::path p = dir / ("img" + std::to_string(i) + ".jpg");
    const ShardReader::Record r = reader.record(i);
    CHECK(std::vector<std::uint8_t>(r.bytes.begin(), r.bytes.end()) == read_bytes(p));
    CHECK(r.label == static_cast<std::int64_t>(i % 2));
    REQUIRE(r.targets.size() == 1);
    CHECK(r.targets[0] == static_cast<float>(i) * 1.5f);
    CHECK(r.path == p.string());
  }
}

TEST_CASE("Data.Shard.PackRefusesAnImageFromItsHeader") {
  // A lossless WebP of a few KB that declares 16000x16000 pixels: refused by max_pixels from its
  // header, as jpeg_decode refuses it, not decoded first.
  TempDir dir;
  write_file(dir / "declares-16000.webp", declaring("WebP lossless", 16000));
  write_file(dir / "photo.jpg", make_jpeg(20, 16, 1));
  const std::vector<DatasetEntry> entries{{(dir / "declares-16000.webp").string(), 0, {}},
                                          {(dir / "photo.jpg").string(), 1, {}}};
  const PackResult result = pack_dataset(entries, (dir / "p.ftpk").string(), 0);
  CHECK(result.written == 1);
  REQUIRE(result.skipped.size() == 1);
  CHECK(result.skipped[0].path == (dir / "declares-16000.webp").string());
  CHECK(result.skipped[0].reason == "image 16000x16000 exceeds max_pixels 100000000");
}

TEST_CASE("Data.Shard.PackResizesOnlyLargerImages") {
  TempDir dir;
  write_file(dir / "wide.jpg", make_jpeg(100, 40, 1));
  write_file(dir / "tall.jpg", make_jpeg(30, 90, 2));
  write_file(dir / "small.jpg", make_jpeg(32, 20, 3));
  const std::vector<DatasetEntry> entries{{(dir / "wide.jpg").string(), 0, {}},
                                          {(dir / "tall.jpg").string(), 1, {}},
                                          {(dir / "small.jpg").string(), 2, {}}};
  const std::string out = (dir / "small.ftpk").string();
  const PackResult result = pack_dataset(entries, out, 32);
  CHECK(result.written == 3);
  CHECK(result.resized == 2);
  CHECK(result.skipped.empty());

  const ShardReader reader(out);
  auto decoded_size = [&](std::size_t i) {
    const ShardReader::Record r = reader.record(i);
    const cv::Mat raw(1, static_cast<int>(r.bytes.size()), CV_8UC1,
                      const_cast<std::uint8_t*>(r.bytes.data()));
    const cv::Mat image = cv::imdecode(raw, cv::IMREAD_COLOR);
    REQUIRE(!image.empty());
    return cv::Size(image.cols, image.rows);
  };
  CHECK(decoded_size(0) == cv::Size(32, 13));  // 100x40 -> longer side 32
  CHECK(decoded_size(1) == cv::Size(11, 32));  // 30x90
  CHECK(decoded_size(2) == cv::Size(32, 20));  // not above 32: bytes kept
  const ShardReader::Record small = reader.record(2);
  CHECK(std::vector<std::uint8_t>(small.bytes.begin(), small.bytes.end()) ==
        read_bytes(dir / "small.jpg"));
  CHECK(reader.record(1).path == (dir / "tall.jpg").string());
  CHECK(reader.record(1).label == 1);
}

TEST_CASE("Data.Shard.TruncatedShardGivesClearError") {
  TempDir dir;
  const std::string path = (dir / "s.ftpk").string();
  {
    ShardWriter writer(path);
    for (int i = 0; i < 3; ++i) writer.add(make_jpeg(16, 16, i), i, {}, "x.jpg");
    writer.finish();
  }
  const std::vector<std::uint8_t> whole = read_bytes(path);
  const std::string cut = (dir / "cut.ftpk").string();
  for (const std::size_t keep : {whole.size() - 1, whole.size() / 2, std::size_t{30}}) {
    CAPTURE(keep);
    write_file(cut, std::vector<std::uint8_t>(whole.begin(), whole.begin() + keep));
    const std::string message = error_of([&] { ShardReader reader(cut); });
    CHECK(message.starts_with(cut + ": truncated"));
    CHECK(message.find('\n') == std::string::npos);
  }
}

TEST_CASE("Data.Shard.ForeignFileGivesClearError") {
  TempDir dir;
  const std::string text = (dir / "notes.txt").string();
  write_file(text, "path,label\na.jpg,1\n... and more text to fill up a header and a footer\n");
  CHECK(error_of([&] { ShardReader reader(text); }) ==
        text + ": not a flowtrain shard (no 'FTPK' magic at the start)");
  const std::string jpeg = (dir / "image.jpg").string();
  write_file(jpeg, make_jpeg(8, 8, 0));
  CHECK(contains(error_of([&] { ShardReader reader(jpeg); }), "not a flowtrain shard"));
  const std::string empty = (dir / "empty.ftpk").string();
  write_file(empty, "");
  CHECK(error_of([&] { ShardReader reader(empty); }) ==
        empty + ": empty file, not a flowtrain shard");
  const std::string missing = (dir / "missing.ftpk").string();
  CHECK(error_of([&] { ShardReader reader(missing); }) ==
        missing + ": cannot open (No such file or directory)");

  // A shard of another format version: version 1, without checksums, or a later one.
  const std::string other = (dir / "other.ftpk").string();
  {
    ShardWriter writer(other);
    writer.finish();
  }
  std::vector<std::uint8_t> bytes = read_bytes(other);
  bytes[4] = 1;
  write_file(other, bytes);
  CHECK(error_of([&] { ShardReader reader(other); }) ==
        other +
            ": shard format version 1 (without checksums), this build reads version 2: re-pack "
            "it with this build's `flowtrain pack`");
  bytes[4] = 3;
  write_file(other, bytes);
  CHECK(error_of([&] { ShardReader reader(other); }) ==
        other +
            ": shard format version 3, this build reads version 2: re-pack it with this "
            "build's `flowtrain pack`");

  // A footer that points outside the file.
  const std::string bad = (dir / "bad.ftpk").string();
  {
    ShardWriter writer(bad);
    writer.add(as_bytes("abc"), 0, {}, "a");
    writer.finish();
  }
  bytes = read_bytes(bad);
  bytes[bytes.size() - kShardFooterSize] = 0xF8;  // index offset
  write_file(bad, bytes);
  CHECK(contains(error_of([&] { ShardReader reader(bad); }), bad + ": corrupt footer"));
}

TEST_CASE("Data.Shard.DamageIsFoundByItsChecksum") {
  TempDir dir;
  std::vector<DatasetEntry> entries;
  for (int i = 0; i < 3; ++i) {
    const fs::path p = dir / ("img" + std::to_string(i) + ".jpg");
    write_file(p, make_jpeg(24, 16, i));
    entries.push_back({p.string(), i, {static_cast<float>(i) * 100}});
  }
  const std::string path = (dir / "s.ftpk").string();
  REQUIRE(pack_dataset(entries, path, 0).written == 3);
  const std::vector<std::uint8_t> whole = read_bytes(path);
  std::uint64_t index = 0;  // the footer's first field
  std::memcpy(&index, whole.data() + whole.size() - kShardFooterSize, sizeof index);
  const std::size_t entry1 = index + 16 + kShardRecordEntrySize;  // record 1's index entry
  std::uint64_t record1 = 0;
  std::memcpy(&record1, whole.data() + entry1, sizeof record1);
  const std::string damaged = (dir / "damaged.ftpk").string();
  auto damage = [&](std::size_t at) {
    std::vector<std::uint8_t> bytes = whole;
    bytes[at] ^= 0x01;
    write_file(damaged, bytes);
  };
  const std::string index_damaged =
      damaged +
      ": damaged index (checksum mismatch): its labels, targets, paths and record places cannot "
      "be trusted; re-pack the shard";

  // A flipped bit in a label (1 becomes 0), a target, a path or a record's size: the shard does
  // not open.
  for (const std::size_t at : {entry1 + 16, index + 16 + 3 * kShardRecordEntrySize + 4,
                               whole.size() - kShardFooterSize - 2, entry1 + 8}) {
    CAPTURE(at);
    damage(at);
    CHECK(error_of([&] { ShardReader reader(damaged); }) == index_damaged);
  }
  // A flipped bit in record 1's image: it opens, and the other records read, but record 1 is an
  // error naming it.
  damage(static_cast<std::size_t>(record1) + 100);
  const ShardReader reader(damaged);
  CHECK(reader.record(0).label == 0);
  CHECK(reader.record(2).label == 2);
  CHECK(error_of([&] { reader.record(1); }) ==
        damaged + ": record 1 (" + entries[1].path +
            ") is damaged (checksum mismatch); re-pack the shard");
}

TEST_CASE("Data.Shard.TruncatedWhileOpenIsAnErrorNotSigbus") {
  // The shard is mapped: reading a page another process truncated away would raise SIGBUS.
  TempDir dir;
  const std::string path = (dir / "s.ftpk").string();
  {
    ShardWriter writer(path);
    for (int i = 0; i < 3; ++i) writer.add(make_jpeg(64, 64, i), i, {}, "x.jpg");
    writer.finish();
  }
  const ShardReader reader(path);
  CHECK(reader.record(2).label == 2);
  const auto size = fs::file_size(path);
  fs::resize_file(path, 100);
  CHECK(error_of([&] { reader.record(2); }) ==
        path + ": truncated to 100 bytes while in use (" + std::to_string(size) +
            " when opened); a shard must not change while read");
}

TEST_CASE("Data.Shard.UnfinishedWriterLeavesNoFile") {
  TempDir dir;
  const std::string path = (dir / "s.ftpk").string();
  {
    ShardWriter writer(path);
    writer.add(as_bytes("abc"), 0, {}, "a");
    CHECK(fs::exists(path + ".tmp"));
  }
  CHECK(!fs::exists(path));
  CHECK(!fs::exists(path + ".tmp"));
  CHECK(contains(error_of([&] { ShardWriter writer((dir / "no/such/dir.ftpk").string()); }),
                 "no/such/dir.ftpk: cannot create " + (dir / "no/such/dir.ftpk.tmp").string() +
                     " (No such file or directory)"));
}

TEST_CASE("Data.Shard.TargetCountMustMatch") {
  TempDir dir;
  const float one = 1;
  ShardWriter writer((dir / "s.ftpk").string());
  writer.add(as_bytes("a"), 0, {&one, 1}, "a.jpg");
  CHECK(contains(error_of([&] { writer.add(as_bytes("b"), 0, {}, "b.jpg"); }),
                 "record 1 (b.jpg) has 0 targets, the first record had 1"));
  const std::vector<DatasetEntry> entries{{"a.jpg", 0, {1}}, {"b.jpg", 0, {}}};
  CHECK(contains(error_of([&] { pack_dataset(entries, (dir / "p.ftpk").string(), 0); }),
                 "b.jpg has 0 targets, a.jpg has 1"));
}

// ----------------------------------------------------------------------------------- sources

TEST_CASE("Data.Sources.RegisteredWithDocs") {
  for (const char* type : kSourceTypes) {
    CAPTURE(type);
    const StageInfo* info = Registry::global().find(type);
    REQUIRE(info != nullptr);
    CHECK(info->shape.kind == StageShape::Kind::kSource);
    CHECK(info->shape.output.id == ItemType::of<Sample>().id);
    CHECK(!info->doc.summary.empty());
    for (const ParamSpec& p : info->doc.params) CHECK(!p.doc.empty());
    for (const char* name :
         {"epochs", "seed", "shuffle", "rank", "world_size", "uneven", "limit"}) {
      CHECK(info->find_param(name) != nullptr);
    }
  }
}

TEST_CASE("Data.Sources.PipelineRunEmitsExpectedCount" * doctest::timeout(60)) {
  const SourceFixture f;
  for (const char* type : kSourceTypes) {
    CAPTURE(type);
    const std::vector<Sample> samples = run_source(make_source(f, type, {.epochs = 2}));
    REQUIRE(samples.size() == 2 * SourceFixture::kCount);
    for (const Sample& s : samples) {
      CAPTURE(s.index);
      REQUIRE(s.index < SourceFixture::kCount);
      CHECK(s.label == static_cast<std::int64_t>(s.index * 3 / SourceFixture::kCount));
      const std::string bytes = "bytes of image " + std::to_string(s.index);
      if (std::string(type) == "shard") {
        CHECK(s.path == f.shard + "#" + std::to_string(s.index));
        CHECK(std::vector<std::uint8_t>(s.encoded.bytes.begin(), s.encoded.bytes.end()) ==
              as_bytes(bytes));
        CHECK(s.encoded.owner != nullptr);  // a view into the mapping, which it keeps alive
      } else {
        CHECK(s.path == f.paths[s.index]);
        CHECK(s.encoded.empty());
      }
      if (std::string(type) == "image_folder") {
        CHECK(s.targets.empty());
      } else {
        CHECK(s.targets == std::vector<float>{static_cast<float>(s.index * 10) + 0.5f});
      }
    }
    // Epoch 0 first, then epoch 1, each a permutation.
    for (std::uint32_t epoch = 0; epoch < 2; ++epoch) {
      std::set<std::uint64_t> seen;
      for (std::size_t k = 0; k < SourceFixture::kCount; ++k) {
        const Sample& s = samples[epoch * SourceFixture::kCount + k];
        CHECK(s.epoch == epoch);
        seen.insert(s.index);
      }
      CHECK(seen.size() == SourceFixture::kCount);
    }
  }
}

TEST_CASE("Data.Sources.EachSampleOncePerEpochAcrossRanks" * doctest::timeout(60)) {
  const SourceFixture f;
  constexpr std::uint32_t kEpochs = 2;
  for (const char* type : kSourceTypes) {
    for (const std::int64_t world : {2, 3}) {
      for (const Uneven uneven : {Uneven::kPad, Uneven::kDrop}) {
        CAPTURE(type);
        CAPTURE(world);
        CAPTURE(enum_name(uneven));
        const bool pad = uneven == Uneven::kPad;
        const std::size_t n = SourceFixture::kCount;
        const std::size_t w = static_cast<std::size_t>(world);
        const std::size_t per_rank = pad ? (n + w - 1) / w : n / w;
        // counts[epoch][index] over all ranks
        std::vector<std::map<std::uint64_t, std::size_t>> counts(kEpochs);
        for (std::int64_t rank = 0; rank < world; ++rank) {
          const std::vector<Sample> samples = run_source(make_source(
              f, type,
              {.epochs = kEpochs, .seed = 5, .rank = rank, .world_size = world, .uneven = uneven}));
          CHECK(samples.size() == per_rank * kEpochs);  // equal counts per rank
          for (const Sample& s : samples) ++counts[s.epoch][s.index];
        }
        for (std::uint32_t epoch = 0; epoch < kEpochs; ++epoch) {
          CAPTURE(epoch);
          std::size_t total = 0, repeats = 0;
          for (const auto& [index, count] : counts[epoch]) {
            CHECK(index < n);
            CHECK(count <= 2);
            total += count;
            repeats += count - 1;
          }
          CHECK(total == per_rank * w);
          if (pad) {
            CHECK(counts[epoch].size() == n);    // every sample once...
            CHECK(repeats == per_rank * w - n);  // ...plus only the padding
          } else {
            CHECK(repeats == 0);
            CHECK(counts[epoch].size() == per_rank * w);
          }
        }
      }
    }
  }
}

TEST_CASE("Data.Sources.ShuffleFollowsSeedAndEpoch" * doctest::timeout(60)) {
  const SourceFixture f;
  auto order = [&](const char* type, std::int64_t seed, bool shuffle) {
    std::vector<std::uint64_t> out;
    for (const Sample& s :
         run_source(make_source(f, type, {.epochs = 2, .seed = seed, .shuffle = shuffle}))) {
      out.push_back(s.index);
    }
    return out;
  };
  for (const char* type : kSourceTypes) {
    CAPTURE(type);
    const std::vector<std::uint64_t> a = order(type, 3, true);
    CHECK(a == order(type, 3, true));
    CHECK(a != order(type, 4, true));
    const std::vector<std::uint64_t> epoch0(a.begin(), a.begin() + SourceFixture::kCount);
    const std::vector<std::uint64_t> epoch1(a.begin() + SourceFixture::kCount, a.end());
    CHECK(epoch0 != epoch1);
    // The same order EpochOrder gives: the sources add no iteration logic of their own.
    CHECK(epoch1 == EpochOrder(SourceFixture::kCount, {.seed = 3}).indices(1));
    const std::vector<std::uint64_t> plain = order(type, 3, false);
    for (std::size_t k = 0; k < plain.size(); ++k) CHECK(plain[k] == k % SourceFixture::kCount);
  }
}

TEST_CASE("Data.Sources.LimitTakesFirstEntries" * doctest::timeout(60)) {
  const SourceFixture f;
  for (const char* type : kSourceTypes) {
    CAPTURE(type);
    const std::vector<Sample> samples = run_source(make_source(f, type, {.limit = 4}));
    CHECK(samples.size() == 4);
    for (const Sample& s : samples) CHECK(s.index < 4);
    CHECK(run_source(make_source(f, type, {.limit = 100})).size() == SourceFixture::kCount);
  }
}

TEST_CASE("Data.Sources.BadParamsGiveClearErrors") {
  const SourceFixture f;
  for (const char* type : kSourceTypes) {
    CAPTURE(type);
    auto error_with = [&](const SourceOptions& source) {
      return error_of([&] { make_source(f, type, source); });
    };
    CHECK(error_with({.rank = 2, .world_size = 2}) ==
          "param 'rank' (2) must be below world_size (2)");
    CHECK(error_with({.world_size = -1}) ==
          "param 'world_size' must be in [0, 9223372036854775807], got -1");
    CHECK(error_with({.rank = -2}) == "param 'rank' must be in [-1, 9223372036854775807], got -2");
    CHECK(error_of([&] { make_stage(type, ""); }) ==
          "param '" + f.location_param(type) + "' is required");
  }
  CHECK(contains(error_of([&] { make_stage("shard", f.manifest); }),
                 f.manifest + ": not a flowtrain shard"));
  CHECK(contains(error_of([&] { make_stage("csv_manifest", f.shard); }),
                 f.shard + ":1: header must start with 'path,label'"));

  // From a config, validation names the location and stage, before anything is built: one line.
  Registry registry;
  registry.add(*Registry::global().find("image_folder"));
  registry.add({"sink", {"discards items", {}}, Sink<Anything>::static_shape(), [](const Params&, const BuildContext&) {
                  return std::unique_ptr<Stage>(
                      new ProbeSink<Anything>([](Anything&&, ItemContext&) {}));
                }});
  const std::string yaml = "stages:\n  - {type: image_folder, params: {root: '" + f.root +
                           "', uneven: evn}}\n  - {type: sink}\n";
  CHECK(error_of([&] { parse_pipeline_config(yaml, "c.yaml", {}, registry); }) ==
        "c.yaml:2: stage 'image_folder' (image_folder): param 'uneven' must be one of pad, drop, "
        "split, got 'evn'");
}

// Resume: a source sought to position p emits exactly what a fresh one emits from its p-th
// sample on (epochs, shuffles and positions included), and plans the rest of the run.
TEST_CASE("Data.Sources.SeekContinuesTheSameStream" * doctest::timeout(60)) {
  const SourceFixture f;
  for (const char* type : kSourceTypes) {
    CAPTURE(type);
    const SourceOptions options = {.epochs = 3, .seed = 9};
    const std::vector<Sample> whole = run_source(make_source(f, type, options));
    REQUIRE(whole.size() == 3 * SourceFixture::kCount);
    for (std::size_t k = 0; k < whole.size(); ++k) CHECK(whole[k].position == k);
    for (const std::uint64_t at : {std::uint64_t{0}, std::uint64_t{1}, SourceFixture::kCount - 1,
                                   SourceFixture::kCount, SourceFixture::kCount + 3,
                                   3 * SourceFixture::kCount}) {
      CAPTURE(at);
      std::unique_ptr<Stage> source = make_source(f, type, options);
      REQUIRE(source->seek(at));
      CHECK(source->plan(std::nullopt) == whole.size() - at);
      const std::vector<Sample> rest = run_source(std::move(source));
      REQUIRE(rest.size() == whole.size() - at);
      for (std::size_t k = 0; k < rest.size(); ++k) {
        CHECK(rest[k].index == whole[at + k].index);
        CHECK(rest[k].epoch == whole[at + k].epoch);
        CHECK(rest[k].position == whole[at + k].position);
      }
    }
    // Past the end: refused, nothing changed.
    std::unique_ptr<Stage> source = make_source(f, type, options);
    CHECK_FALSE(source->seek(3 * SourceFixture::kCount + 1));
    CHECK(source->plan(std::nullopt) == whole.size());
  }
}

// Without rank/world_size params a source takes its shard from the job's placement, which the
// runner hands the stages it builds (and never from the environment itself).
TEST_CASE("Data.Sources.RankFromTheJobPlacement" * doctest::timeout(60)) {
  const SourceFixture f;
  const auto as_rank = [&](int rank, int world_size, int ranks_per_shard = 1) {
    JobPlacement job{.rank = rank, .world_size = world_size};
    BuildContext context;
    context.provide(job);
    std::vector<std::uint64_t> indices;
    for (const Sample& s : run_source(make_stage("csv_manifest", f.location("csv_manifest"),
                                                 {.ranks_per_shard = ranks_per_shard}, context))) {
      indices.push_back(s.index);
    }
    return indices;
  };
  const std::vector<std::uint64_t> r0 = as_rank(0, 2), r1 = as_rank(1, 2);
  CHECK(r0.size() == SourceFixture::kCount / 2);
  CHECK(r1.size() == SourceFixture::kCount / 2);
  std::set<std::uint64_t> all(r0.begin(), r0.end());
  all.insert(r1.begin(), r1.end());
  CHECK(all.size() == SourceFixture::kCount);
  // Ranks of one pipeline (ranks_per_shard) read the same samples.
  CHECK(as_rank(0, 4, 2) == as_rank(1, 4, 2));
  CHECK(as_rank(2, 4, 2) == r1);
  // No placement handed in: one process reads everything.
  CHECK(run_source(make_source(f, "csv_manifest")).size() == SourceFixture::kCount);
}

TEST_CASE("Data.Dataset.ClassTargetMediansPerClassAndOverall") {
  CsvManifest m;
  m.target_names = {"energy", "protein"};
  const auto row = [&](std::int64_t label, float energy, float protein) {
    m.entries.push_back({"x.jpg", label, {energy, protein}});
  };
  row(0, 100, 1);
  row(0, 300, 3);
  row(0, 200, 9);  // class 0: odd count, the middle value
  row(2, 50, 4);
  row(2, 70, 8);  // class 2: even count, the mean of the two middle values
  row(-1, 1000, 0);  // no label: only in the overall medians
  const ClassTargetMedians medians = class_target_medians(m);
  REQUIRE(medians.by_class.size() == 3);
  CHECK(medians.of(0) == std::vector<float>{200, 3});
  CHECK(medians.of(2) == std::vector<float>{60, 6});
  // Over all 6 rows: energies 50 70 100 200 300 1000, proteins 0 1 3 4 8 9.
  CHECK(medians.overall == std::vector<float>{150, 3.5});
  CHECK(medians.of(1) == medians.overall);   // a class without rows
  CHECK(medians.of(7) == medians.overall);   // a class the manifest never names
  CHECK(medians.of(-1) == medians.overall);

  CsvManifest no_targets;
  no_targets.entries.push_back({"x.jpg", 0, {}});
  CHECK_THROWS_WITH_AS(class_target_medians(no_targets),
                       "class target medians: the manifest has no target column", Error);
  m.entries.clear();
  CHECK_THROWS_WITH_AS(class_target_medians(m), "class target medians: the manifest has no row",
                       Error);
}
