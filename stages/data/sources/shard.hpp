#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "graph/atomic_file.hpp"
#include "stages/data/sources/listing.hpp"

namespace flowtrain::data {

/// The packed shard format ("precompute once"): one file, little-endian, mapped by the reader.
///
///   header   16 B   "FTPK", u32 version, u64 reserved (0)
///   records         encoded image bytes, back to back, then zero padding to a multiple of 8
///   index           u64 record count n, u32 target count t, u32 reserved (0),
///                   n x 48 B {u64 offset, u64 size, i64 label, u64 path offset, u64 path size,
///                   u64 checksum of the record's bytes}, n x t f32 targets, then the original
///                   paths (UTF-8, path offsets relative to the start of this string area)
///   footer   32 B   u64 index offset, u64 index size, u64 checksum of the index, u32 version,
///                   "FTPK"
///
/// The footer makes a truncated or unfinished file detectable; record i is found in O(1).
/// Checksums are data::hash_bytes (stages/data/splitmix.hpp, as the teacher cache's records):
/// the index's is checked when the shard opens, a record's each time it is read, so a flipped
/// label or a damaged image is an error naming the file, never trained on. Version 1 had none.
inline constexpr char kShardMagic[4] = {'F', 'T', 'P', 'K'};
inline constexpr std::uint32_t kShardVersion = 2;
inline constexpr std::size_t kShardHeaderSize = 16;
inline constexpr std::size_t kShardFooterSize = 32;
inline constexpr std::size_t kShardRecordEntrySize = 48;

/// Writes a shard. The data go to `path` + ".tmp", renamed to `path` by finish(), so a reader
/// never sees a partial shard; destroying an unfinished writer removes the temporary file.
class ShardWriter {
 public:
  /// Throws Error if the file cannot be created.
  explicit ShardWriter(std::string path);

  /// Appends a record. Every record has the same number of targets (that of the first); throws
  /// Error otherwise, or on a write failure.
  void add(std::span<const std::uint8_t> bytes,
           std::int64_t label,
           std::span<const float> targets,
           std::string_view source_path);

  /// Writes the index and footer and moves the file into place. Throws Error on failure.
  void finish();

  std::size_t size() const { return labels_.size(); }
  const std::string& path() const { return file_.path(); }

 private:
  AtomicFile file_;  // path.tmp until finish()
  bool finished_ = false;
  std::size_t target_count_ = 0;
  std::vector<std::uint64_t> offsets_;
  std::vector<std::uint64_t> sizes_;
  std::vector<std::int64_t> labels_;
  std::vector<std::uint64_t> checksums_;
  std::vector<float> targets_;
  std::vector<std::uint64_t> path_ends_;
  std::string paths_;
};

/// Maps a shard read-only and gives O(1) access to its records. Validates the magic, version,
/// footer, the index's checksum and every index entry when it opens; record() checks that the
/// file still has its size and the record its checksum.
///
/// The file must not change while it is open: it is mapped, and reading a page that another
/// process truncated away would kill this one with SIGBUS. record() checks the size first
/// (fstat), which catches a truncation before the record is read, but not one between that check
/// and the last read of its bytes (the sample's decode, later). `flowtrain pack` never truncates
/// in place: it writes FILE.tmp and renames it over FILE, and an open mapping keeps the old one.
class ShardReader {
 public:
  /// How records will be read, passed to the kernel (madvise) for its read-ahead.
  enum class Access { kRandom, kSequential };

  struct Record {
    std::span<const std::uint8_t> bytes;  // the encoded image, in the mapping
    std::int64_t label = -1;
    std::span<const float> targets;
    std::string_view path;  // the path the record was packed from
  };

  /// Throws Error naming `path` and the problem: missing, not a shard (bad magic), another
  /// version (say, 1: re-pack it), truncated or unfinished (no footer), an index that fails its
  /// checksum, or one pointing outside the file.
  explicit ShardReader(std::string path, Access access = Access::kRandom);
  ~ShardReader();
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  std::size_t size() const { return count_; }
  std::size_t target_count() const { return target_count_; }
  const std::string& path() const { return path_; }

  /// Record `i`. Throws Error if i >= size(), if the file is now shorter than when it was
  /// opened, or if the record's bytes fail their checksum ("record 3 (photos/a.jpg) is damaged").
  Record record(std::size_t i) const;

 private:
  [[noreturn]] void fail(const std::string& what) const;

  std::string path_;
  int fd_ = -1;                         // kept open for record()'s size check
  const std::uint8_t* data_ = nullptr;  // the mapping
  std::size_t file_size_ = 0;
  std::size_t count_ = 0;
  std::size_t target_count_ = 0;
  const std::uint8_t* entries_ = nullptr;  // count_ x kShardRecordEntrySize
  const float* targets_ = nullptr;         // count_ x target_count_
  const char* strings_ = nullptr;
};

/// A dataset entry pack_dataset left out, and why.
struct PackSkip {
  std::string path;
  std::string reason;
};

struct PackResult {
  std::size_t written = 0;  // records in the shard
  std::size_t resized = 0;  // of which re-encoded smaller
  std::vector<PackSkip> skipped;
};

/// Called after each entry with (entries done, entries in all).
using PackProgress = std::function<void(std::size_t done, std::size_t total)>;

/// Packs `entries` into a shard at `out_path`, in order, with their labels, targets and paths.
/// Each file is decoded once to check it (EXIF orientation ignored, as jpeg_decode does); with
/// max_side > 0, an image whose longer side exceeds it is resized (INTER_AREA) to that longer
/// side and re-encoded as JPEG quality 90, otherwise its bytes are kept as they are. Files that
/// cannot be read or decoded are skipped and listed with the reason. Throws Error if the entries
/// do not all have the same number of targets or the shard cannot be written.
PackResult pack_dataset(const std::vector<DatasetEntry>& entries,
                        const std::string& out_path,
                        int max_side,
                        const PackProgress& progress = {});

}  // namespace flowtrain::data
