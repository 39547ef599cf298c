#include "stages/data/sources/listing.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <string_view>
#include <system_error>

#include "graph/csv.hpp"
#include "graph/error.hpp"

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

}  // namespace flowtrain::data
