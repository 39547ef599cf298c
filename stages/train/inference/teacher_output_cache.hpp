#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "stages/train/files/folder_lock.hpp"

namespace flowtrain::train {

/// A 128-bit digest of one exact view: the image's identity (its path) and every augmentation
/// parameter (crop rectangle, flip, jitter). Two hashes of the same bytes with different seeds,
/// so a collision between two views is not a practical concern.
struct ViewDigest {
  std::uint64_t hi = 0;
  std::uint64_t lo = 0;
  bool operator==(const ViewDigest&) const = default;
};

/// data::hash_bytes of a whole file (a teacher's fingerprint); throws Error naming the file if it
/// cannot be read.
std::uint64_t hash_file(const std::string& path);

/// How the cache stores one view's teacher outputs (fixed per cache file, so every record has
/// the same size).
struct EntryFormat {
  enum class Dtype : std::uint32_t { kFloat16 = 1, kBFloat16 = 2 };
  std::uint32_t classes = 0;
  /// 0: every logit is stored. Else the top_k largest (value and class index) and one value
  /// for the others: the log of the mean of their exp, so softmax at temperature 1 gives them
  /// the mass they had together, spread evenly.
  std::uint32_t top_k = 0;
  std::uint32_t regression = 0;  // regression outputs, stored in full
  Dtype dtype = Dtype::kFloat16;

  /// Bytes of one entry's outputs.
  std::size_t payload_bytes() const;
  bool operator==(const EntryFormat&) const = default;
};

/// Writes one view's outputs (`classes` logits, `regression` values) in `format` to `out`
/// (payload_bytes). A pure function of its inputs.
void encode_outputs(const EntryFormat& format,
                    const float* logits,
                    const float* regression,
                    std::uint8_t* out);
/// What encode_outputs wrote, back as float32: logits[classes], regression[regression].
void decode_outputs(const EntryFormat& format,
                    const std::uint8_t* in,
                    float* logits,
                    float* regression);

/// A file of a frozen teacher's outputs, one entry per exact view, for the `teacher_cache` stage.
///
/// The header says what its entries are valid for: the teacher (a hash of its file's content,
/// and its precision) and the data recipe (a hash of the params that shape the pixels of a
/// view), and the entry format. Opening a file made for anything else fails with one line
/// naming what differs (or, with `replace_on_mismatch`, starts the file afresh).
///
/// Entries are appended in records, one per teacher batch: a record header, its entries (view
/// digest + outputs) and one checksum over all of it. A record is written by one write(2) and
/// counts only once whole and verified, so a run killed while writing loses at most that
/// record, never leaves a wrong entry, and the next open cuts the torn tail off. A damaged
/// record costs itself only: the next open skips it to the next whole record (found by its
/// magic and checksum). Entries of existing records are read with pread(2) when asked for and
/// checked against a hash kept in memory, so a file another process cuts short or rewrites
/// during the run is an Error naming it, never a crash nor a wrong entry; new ones are kept in
/// memory as they are written.
///
/// Lookups decide in sequence order and never by timing: a view is a hit if stored, "wait" if
/// an earlier lookup of this run is computing it (entry() then waits for its store), else the
/// caller computes it. Thread-safe; one process at a time holds a file (flock).
class TeacherOutputCache {
 public:
  struct Fingerprint {
    std::uint64_t teacher = 0;  // hash_file of the teacher, mixed with its precision
    std::uint64_t recipe = 0;   // the data stages' pixel recipe (ViewKey::recipe)
    /// For messages: "runs/foodtag/teacher/final.pt (bf16); data recipe 1a2b...".
    std::string text;
  };
  struct Options {
    std::string path;
    Fingerprint fingerprint;
    std::uint32_t top_k = 100;  // store all logits up to this many classes, else the top_k
    EntryFormat::Dtype dtype = EntryFormat::Dtype::kFloat16;
    bool replace_on_mismatch = false;
    double wait_timeout_s = 600;  // how long entry() waits for a view another batch computes
    /// Use the entries the file holds (if it exists and matches), but never create, lock or
    /// change it: new entries stay in memory (an autotune rehearsal's cache, thrown away).
    bool read_only = false;
  };
  struct Stats {
    std::uint64_t entries = 0;
    std::uint64_t file_bytes = 0;
    std::uint64_t dropped_bytes = 0;  // a torn or damaged tail cut off at open
    std::uint64_t damaged_bytes = 0;  // damaged records before the tail, skipped at open
    bool replaced = false;            // a mismatched file was started afresh
    double seconds_per_entry = 0;     // the teacher's forward time per view, as recorded
  };
  enum class Lookup { kHit, kCompute, kWait };

  /// Opens `options.path` (creating it and its folder if absent); throws Error naming the file
  /// and the reason: another run holds it, a mismatched fingerprint, an unreadable header.
  explicit TeacherOutputCache(Options options);
  ~TeacherOutputCache();
  TeacherOutputCache(const TeacherOutputCache&) = delete;
  TeacherOutputCache& operator=(const TeacherOutputCache&) = delete;

  /// What to do for each view, in order; marks the kCompute ones as being computed (by the
  /// caller, which must store() or abandon() them).
  std::vector<Lookup> lookup(std::span<const ViewDigest> keys);
  /// Stores the outputs of views lookup() returned kCompute for: `logits` [n, classes] and
  /// `regression` [n, regression] float32 rows (regression may be null when it is 0), computed
  /// in `forward_s` seconds. The first store fixes the entry format; later ones must match.
  void store(std::span<const ViewDigest> keys,
             const float* logits,
             std::uint32_t classes,
             const float* regression,
             std::uint32_t regression_outputs,
             double forward_s);
  /// Gives up views lookup() returned kCompute for (their batch failed): a wait for them
  /// then throws instead of hanging.
  void abandon(std::span<const ViewDigest> keys);
  /// Appends the stored outputs of `key` (payload_bytes of format()) to `out`, waiting while
  /// another batch computes them; throws Error if they never arrive (abandoned, or
  /// wait_timeout_s), or if the file no longer holds them (another process cut it short or
  /// rewrote it during the run).
  void entry(const ViewDigest& key, std::vector<std::uint8_t>& out);
  /// The entry format, once known (from the file, or the first store).
  std::optional<EntryFormat> format() const;
  Stats stats() const;
  const std::string& path() const { return o_.path; }

 private:
  struct DigestHash {
    std::size_t operator()(const ViewDigest& d) const { return static_cast<std::size_t>(d.lo); }
  };
  // Where an entry's outputs are: in a record this run wrote (`memory`), else at `offset` in
  // the file, whose bytes must hash to `check` (as they did when the file was opened).
  struct Stored {
    const std::uint8_t* memory = nullptr;
    std::uint64_t offset = 0;
    std::uint64_t check = 0;
  };
  void open_file();
  void load_records(std::uint64_t from, std::uint64_t size);
  bool read_record(std::uint64_t at, std::uint64_t size, std::vector<std::uint8_t>& record) const;
  std::optional<std::uint64_t> find_record(std::uint64_t from,
                                           std::uint64_t size,
                                           std::vector<std::uint8_t>& record) const;
  void write_header(const EntryFormat& format);

  Options o_;
  std::unique_ptr<FolderLock> lock_;
  int fd_ = -1;

  mutable std::mutex mutex_;
  std::condition_variable stored_;
  std::optional<EntryFormat> format_;
  std::uint64_t end_ = 0;  // file offset of the next record
  std::unordered_map<ViewDigest, Stored, DigestHash> index_;
  std::unordered_map<ViewDigest, bool, DigestHash> pending_;  // true: abandoned
  std::deque<std::vector<std::uint8_t>> written_;             // records written by this run
  Stats stats_;
  double recorded_forward_s_ = 0;
};

}  // namespace flowtrain::train
