#include "stages/data/dataset.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <set>
#include <string_view>
#include <system_error>

#include "distributed/job.hpp"
#include "graph/csv.hpp"
#include "graph/error.hpp"
#include "stages/data/splitmix.hpp"

namespace flowtrain::data {

namespace fs = std::filesystem;

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) {
    return static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  });
  return s;
}

bool hidden(const fs::path& p) {
  const std::string name = p.filename().string();
  return !name.empty() && name[0] == '.';
}

std::string join(const std::vector<std::string>& items, const char* sep) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + items[i];
  return out;
}

// The sorted names of the entries of `dir` that pass `keep`; throws Error on a listing failure.
template <class Keep>
std::vector<std::string> list_sorted(const fs::path& dir, Keep keep) {
  std::vector<std::string> names;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    if (!hidden(it->path()) && keep(*it)) names.push_back(it->path().filename().string());
  }
  if (ec) throw Error(dir.string() + ": cannot list folder (" + ec.message() + ")");
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

ImageFolder scan_image_folder(const std::string& root, const std::vector<std::string>& extensions) {
  const fs::path dir(root);
  std::error_code ec;
  const fs::file_status status = fs::status(dir, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) {
    throw Error(root + ": cannot access (" + ec.message() + ")");
  }
  if (!fs::exists(status)) throw Error(root + ": no such folder");
  if (!fs::is_directory(status)) throw Error(root + ": not a folder");

  std::set<std::string> wanted;
  for (const std::string& ext : extensions) {
    wanted.insert(lower(ext.empty() || ext[0] == '.' ? ext : "." + ext));
  }

  ImageFolder folder;
  folder.classes = list_sorted(dir, [](const fs::directory_entry& e) {
    std::error_code ignored;
    return e.is_directory(ignored);
  });
  if (folder.classes.empty()) {
    throw Error(root + ": no class folders (expected " + root + "/<class>/<image>)");
  }
  for (std::size_t label = 0; label < folder.classes.size(); ++label) {
    const fs::path class_dir = dir / folder.classes[label];
    const std::vector<std::string> files =
        list_sorted(class_dir, [&](const fs::directory_entry& e) {
          std::error_code ignored;
          // Anything but a folder, dangling links included: decode reports what it cannot
          // read, so no file is skipped silently.
          return !e.is_directory(ignored) &&
                 (wanted.empty() || wanted.count(lower(e.path().extension().string())) > 0);
        });
    for (const std::string& file : files) {
      folder.entries.push_back({(class_dir / file).string(), static_cast<std::int64_t>(label), {}});
    }
  }
  if (folder.entries.empty()) {
    throw Error(root + ": no images with extension " +
                join(std::vector<std::string>(wanted.begin(), wanted.end()), ", ") + " in its " +
                std::to_string(folder.classes.size()) + " class folders");
  }
  return folder;
}

namespace {

float median_of(std::vector<float>& values) {
  const std::size_t n = values.size();
  std::sort(values.begin(), values.end());
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

}  // namespace

ClassTargetMedians class_target_medians(const CsvManifest& manifest) {
  const std::size_t targets = manifest.target_names.size();
  if (targets == 0 || manifest.entries.empty()) {
    throw Error("class target medians: the manifest has " +
                std::string(targets == 0 ? "no target column" : "no row"));
  }
  std::int64_t classes = 0;
  for (const DatasetEntry& e : manifest.entries) classes = std::max(classes, e.label + 1);
  // [label][target] values; the last slot gathers every row for `overall`.
  std::vector<std::vector<std::vector<float>>> values(
      static_cast<std::size_t>(classes) + 1, std::vector<std::vector<float>>(targets));
  for (const DatasetEntry& e : manifest.entries) {
    for (std::size_t t = 0; t < targets; ++t) {
      if (e.label >= 0) values[static_cast<std::size_t>(e.label)][t].push_back(e.targets[t]);
      values.back()[t].push_back(e.targets[t]);
    }
  }
  ClassTargetMedians out;
  for (std::size_t t = 0; t < targets; ++t) out.overall.push_back(median_of(values.back()[t]));
  for (std::int64_t c = 0; c < classes; ++c) {
    std::vector<std::vector<float>>& of_class = values[static_cast<std::size_t>(c)];
    if (of_class[0].empty()) {
      out.by_class.push_back(out.overall);
      continue;
    }
    std::vector<float> medians;
    for (std::vector<float>& v : of_class) medians.push_back(median_of(v));
    out.by_class.push_back(std::move(medians));
  }
  return out;
}

CsvManifest read_csv_manifest(const std::string& path) {
  if (!std::ifstream(path, std::ios::binary)) {
    std::error_code ec;
    throw Error(path + ": cannot open (" +
                (fs::exists(path, ec) ? "permission denied" : "no such file") + ")");
  }
  const fs::path base = fs::path(path).parent_path();
  const std::vector<CsvRow> rows = read_csv_file(path);
  CsvManifest manifest;
  for (const CsvRow& row : rows) {
    const std::vector<std::string>& fields = row.fields;
    auto fail = [&](const std::string& what) -> Error {
      return Error(path + ":" + std::to_string(row.line) + ": " + what);
    };
    if (&row == &rows.front()) {
      if (fields.size() < 2 || fields[0] != "path" || fields[1] != "label") {
        std::string header = csv_line(fields);
        header.pop_back();
        throw fail("header must start with 'path,label', got '" + header + "'");
      }
      std::set<std::string> seen;
      for (std::size_t c = 2; c < fields.size(); ++c) {
        if (fields[c].empty()) throw fail("header column " + std::to_string(c + 1) + " has no name");
        if (!seen.insert(fields[c]).second || fields[c] == "path" || fields[c] == "label") {
          throw fail("header column '" + fields[c] + "' appears twice");
        }
        manifest.target_names.push_back(fields[c]);
      }
      continue;
    }

    const std::size_t columns = 2 + manifest.target_names.size();
    if (fields.size() != columns) {
      throw fail(std::to_string(fields.size()) + " columns, expected " +
                              std::to_string(columns) + " (path,label" +
                              (manifest.target_names.empty() ? "" : ",") +
                              join(manifest.target_names, ",") + ")");
    }
    DatasetEntry entry;
    if (fields[0].empty()) throw fail("column 'path': empty");
    const fs::path p(fields[0]);
    entry.path = p.is_absolute() ? fields[0] : (base / p).lexically_normal().string();

    const std::string& label = fields[1];
    if (!label.empty()) {
      const char* end = label.data() + label.size();
      const auto [ptr, ec] = std::from_chars(label.data(), end, entry.label);
      if (ec != std::errc() || ptr != end || entry.label < -1) {
        throw fail("column 'label': '" + label +
                                "' is not a class id (an integer >= 0; -1 or empty for none)");
      }
    }
    entry.targets.reserve(manifest.target_names.size());
    for (std::size_t t = 0; t < manifest.target_names.size(); ++t) {
      const std::string& text = fields[2 + t];
      const char* end = text.data() + text.size();
      float value = 0;
      const auto [ptr, ec] = std::from_chars(text.data(), end, value);
      if (text.empty() || ec != std::errc() || ptr != end || !std::isfinite(value)) {
        throw fail("column '" + manifest.target_names[t] + "': '" + text +
                                "' is not a finite number");
      }
      entry.targets.push_back(value);
    }
    manifest.entries.push_back(std::move(entry));
  }
  if (rows.empty()) throw Error(path + ": empty; expected a header row 'path,label[,target...]'");
  if (manifest.entries.empty()) throw Error(path + ": no rows after the header");
  return manifest;
}

EpochOrder::EpochOrder(std::size_t size, Options options) : size_(size), options_(options) {
  if (options_.world_size < 1) throw Error("world_size must be at least 1");
  if (options_.rank >= options_.world_size) {
    throw Error("rank " + std::to_string(options_.rank) + " must be below world_size " +
                std::to_string(options_.world_size));
  }
  const std::size_t w = options_.world_size;
  switch (options_.uneven) {
    case Uneven::kPad:
      per_rank_ = (size_ + w - 1) / w;
      break;
    case Uneven::kDrop:
      per_rank_ = size_ / w;
      break;
    case Uneven::kSplit:
      per_rank_ = size_ / w + (options_.rank < size_ % w ? 1 : 0);
      break;
  }
}

std::size_t EpochOrder::per_rank(std::size_t start) const {
  if (start == 0) return per_rank_;
  const std::size_t rest = start < size_ ? size_ - start : 0;
  const std::size_t w = options_.world_size;
  switch (options_.uneven) {
    case Uneven::kPad:
      return (rest + w - 1) / w;
    case Uneven::kDrop:
      return rest / w;
    case Uneven::kSplit:
      break;
  }
  return rest / w + (options_.rank < rest % w ? 1 : 0);
}

std::vector<std::uint64_t> EpochOrder::indices(std::uint32_t epoch, std::size_t start) const {
  std::vector<std::uint64_t> out;
  const std::size_t count = per_rank(start);
  if (count == 0) return out;
  out.reserve(count);
  const std::size_t w = options_.world_size;
  const std::size_t first = start + options_.rank;
  if (!options_.shuffle) {
    for (std::size_t k = 0; k < count; ++k) out.push_back((first + k * w) % size_);
    return out;
  }
  std::vector<std::uint64_t> perm(size_);
  for (std::size_t i = 0; i < size_; ++i) perm[i] = i;
  std::mt19937_64 rng(options_.seed + epoch);
  portable_shuffle(perm, rng);
  // Position p of the padded order is perm[p % size]: padding repeats from the start.
  for (std::size_t k = 0; k < count; ++k) out.push_back(perm[(first + k * w) % size_]);
  return out;
}

std::size_t SourcePlan::limited(std::size_t size) const {
  return limit > 0 ? std::min(limit, size) : size;
}

SourcePlan source_plan(const SourceOptions& options, const JobPlacement& job) {
  auto check = [](const std::string& name, std::int64_t v, std::int64_t min, std::int64_t max) {
    if (v < min || v > max) {
      throw Error("param '" + name + "' must be in [" + std::to_string(min) + ", " +
                  std::to_string(max) + "], got " + std::to_string(v));
    }
    return v;
  };
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  SourcePlan o;
  o.epochs = static_cast<std::uint32_t>(
      check("epochs", options.epochs, 1, std::numeric_limits<std::uint32_t>::max()));
  o.limit = static_cast<std::size_t>(check("limit", options.limit, 0, kMax));
  o.order.seed = static_cast<std::uint64_t>(check("seed", options.seed, 0, kMax));
  o.order.shuffle = options.shuffle;
  const std::int64_t rank = check("rank", options.rank, -1, kMax);
  const std::int64_t world_size = check("world_size", options.world_size, 0, kMax);
  if (rank < 0 || world_size == 0) {
    const ShardGroup group = shard_group(
        job, static_cast<int>(check("ranks_per_shard", options.ranks_per_shard, 1, 1 << 20)));
    o.order.rank = static_cast<std::size_t>(rank < 0 ? group.index : rank);
    o.order.world_size = static_cast<std::size_t>(world_size == 0 ? group.count : world_size);
  } else {
    o.order.rank = static_cast<std::size_t>(rank);
    o.order.world_size = static_cast<std::size_t>(world_size);
  }
  o.order.uneven = options.uneven;
  if (o.order.rank >= o.order.world_size) {
    throw Error("param 'rank' (" + std::to_string(o.order.rank) + ") must be below world_size (" +
                std::to_string(o.order.world_size) + ")");
  }
  return o;
}

const std::string& required_path(const std::string& path, const std::string& name) {
  if (path.empty()) throw Error("param '" + name + "' is required");
  return path;
}

EpochCursor::EpochCursor(std::size_t size, const SourcePlan& plan)
    : order_(size, plan.order), epochs_(plan.epochs) {}

std::optional<EpochCursor::Position> EpochCursor::next() {
  while (pos_ == indices_.size()) {
    if (next_epoch_ >= epochs_ || order_.per_rank() == 0) return std::nullopt;
    indices_ = order_.indices(next_epoch_++);
    pos_ = 0;
  }
  ++ordinal_;
  return Position{indices_[pos_++], next_epoch_ - 1};
}

std::uint64_t EpochCursor::total() const {
  if (first_.epoch >= epochs_) return first_.ordinal;
  return first_.ordinal + first_count() +
         static_cast<std::uint64_t>(order_.per_rank()) * (epochs_ - first_.epoch - 1);
}

void EpochCursor::begin_at(const FirstEpoch& first) {
  first_ = first;
  indices_.clear();
  pos_ = 0;
  next_epoch_ = first.epoch;
  if (first.epoch < epochs_) indices_ = order_.indices(next_epoch_++, first.start);
  ordinal_ = first.ordinal;
}

bool EpochCursor::seek(std::uint64_t ordinal) {
  const std::uint64_t per_epoch = order_.per_rank();
  if (ordinal > total()) return false;
  if (per_epoch == 0 || ordinal == ordinal_) return true;
  // A resume on the ranks that reached it: the epoch's order from this rank's next row on.
  const std::uint64_t epoch = ordinal / per_epoch;
  const std::uint64_t rows = ordinal % per_epoch;
  begin_at({.ordinal = ordinal,
            .epoch = static_cast<std::uint32_t>(epoch),
            .start = static_cast<std::size_t>(rows * order_.options().world_size)});
  return true;
}

bool EpochCursor::seek_shared(std::uint64_t position) {
  const std::uint64_t size = order_.size();
  if (size == 0) return position == 0;
  const std::uint64_t epoch = position / size;
  const auto start = static_cast<std::size_t>(position % size);
  if (epoch > epochs_ || (epoch == epochs_ && start > 0)) return false;
  // Numbered as seek() numbers it where the ranks that reached it resume (a whole number of
  // rows of this run's ranks); elsewhere, the count only has to run on from there.
  begin_at({.ordinal = epoch * order_.per_rank() + start / order_.options().world_size,
            .epoch = static_cast<std::uint32_t>(epoch),
            .start = start});
  return true;
}

std::optional<std::uint64_t> EpochCursor::shared_position(std::uint64_t ordinal) const {
  if (order_.options().uneven == Uneven::kSplit || ordinal < first_.ordinal) return std::nullopt;
  const std::uint64_t size = order_.size();
  const std::uint64_t ranks = order_.options().world_size;
  std::uint64_t taken = ordinal - first_.ordinal;  // by this rank, and so by each
  const std::uint64_t first = first_count();
  if (taken < first) return first_.epoch * size + first_.start + taken * ranks;
  if (first_.epoch >= epochs_) return first_.epoch * size;  // began at the end
  // Past the first epoch: whole epochs of per_rank() items each.
  taken -= first;
  const std::uint64_t per_epoch = std::max<std::uint64_t>(order_.per_rank(), 1);
  return (first_.epoch + 1 + taken / per_epoch) * size + taken % per_epoch * ranks;
}

bool DatasetSource::seek(std::uint64_t position) { return cursor_.seek(position); }

std::optional<Sample> DatasetSource::next() {
  const std::uint64_t position = cursor_.ordinal();
  const std::optional<EpochCursor::Position> at = cursor_.next();
  if (!at) return std::nullopt;
  Sample sample = make_sample(at->index);
  sample.index = at->index;
  sample.epoch = at->epoch;
  sample.position = position;
  sample.origin = this;
  return sample;
}

void DatasetSource::mixed_at(Sample& sample, std::uint64_t position) {
  sample.position = position;
}

Sample DatasetSource::stand_in(const Sample& bad, std::uint32_t attempt) const {
  // Drawn from (seed, epoch, index, attempt): the same on every run and rank.
  std::uint64_t index =
      splitmix64(seed_ ^ splitmix64(bad.epoch ^ splitmix64(bad.index ^ splitmix64(attempt)))) %
      size_;
  if (index == bad.index && size_ > 1) index = (index + 1) % size_;
  Sample sample = make_sample(index);
  sample.index = index;
  sample.epoch = bad.epoch;
  sample.position = bad.position;
  sample.origin = this;
  return sample;
}

}  // namespace flowtrain::data
