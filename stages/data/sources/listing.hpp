#pragma once

// What a dataset holds before anything is read: its entries, listed from a class-per-folder
// tree (scan_image_folder) or a CSV manifest (read_csv_manifest).

#include <cstdint>
#include <string>
#include <vector>

namespace flowtrain::data {

/// One example of a dataset before anything is read: where it is and what it is.
struct DatasetEntry {
  std::string path;
  std::int64_t label = -1;     // class id; -1 for none
  std::vector<float> targets;  // numeric targets (e.g. energy_kcal), may be empty
};

/// A folder of images laid out root/<class>/<image>.
struct ImageFolder {
  std::vector<DatasetEntry> entries;  // by class name, then file name (byte order)
  std::vector<std::string> classes;   // sorted; classes[label] is the folder name
};

/// Lists root/<class>/<image>: every non-hidden subfolder of `root` is a class, its label the
/// position of its name in sorted order (0..K-1), so ids agree between splits that share class
/// folders, an empty class folder included. Images are the regular files directly in a class
/// folder whose extension is in `extensions` (case-insensitive, with or without the dot; empty:
/// every file). Nothing is read or opened. Throws Error if `root` is missing or not a folder, has
/// no class folder, or no image.
ImageFolder scan_image_folder(const std::string& root,
                              const std::vector<std::string>& extensions = {".jpg", ".jpeg"});

/// The rows of a CSV manifest and the names of its numeric target columns.
struct CsvManifest {
  std::vector<DatasetEntry> entries;      // in file order
  std::vector<std::string> target_names;  // header columns after path,label
};

/// Reads a CSV manifest: a header row `path,label[,target...]`, then one row per example.
/// Relative paths resolve against the CSV's folder. `label` is an integer (empty or -1: none);
/// targets are finite numbers. Fields may be double-quoted ("a,b.jpg", "" for a quote); CRLF
/// line ends, a UTF-8 BOM and blank lines are accepted. Files are not checked here (decode
/// reports a missing one). Throws Error naming file:line and the column of the first bad row.
CsvManifest read_csv_manifest(const std::string& path);

}  // namespace flowtrain::data
