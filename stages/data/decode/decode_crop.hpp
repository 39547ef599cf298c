#pragma once

#include <oneapi/tbb/concurrent_unordered_map.h>
#include <oneapi/tbb/concurrent_unordered_set.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "graph/registry.hpp"
#include "stages/data/batch.hpp"
#include "stages/data/batching/batch_pool.hpp"
#include "stages/data/decode/bad_sample_policy.hpp"
#include "stages/data/decode/jpeg_crop.hpp"
#include "stages/data/decode/jpeg_decode.hpp"
#include "stages/data/sample.hpp"
#include "stages/data/transforms/augment.hpp"
#include "stages/data/transforms/normalizer.hpp"

namespace flowtrain::data {

/// How much of a file decode_crop checks (param check_whole_file).
enum class CheckWholeFile { kOnce, kEveryView };
inline std::span<const EnumName<CheckWholeFile>> enum_names(CheckWholeFile) {
  static constexpr EnumName<CheckWholeFile> names[] = {{CheckWholeFile::kOnce, "once"},
                                                       {CheckWholeFile::kEveryView, "every_view"}};
  return names;
}

/// The params of the `decode_crop` stage.
struct DecodeCropOptions {
  std::int64_t batch_size = 64;
  bool roi = true;
  CheckWholeFile check_whole_file = CheckWholeFile::kOnce;
  std::int64_t mcu_index_mb = 1024;
  AugmentOptions augment;
  SampleDecodeOptions decode;
  NormalizeOptions normalize;
  BatchPoolOptions pool;
  template <class Declare>
  void declare(Declare& d) {
    d(batch_size, "batch_size", "rows of a batch (assemble_batch's batch_size too)",
      {.min = 1, .max = 1 << 20});
    d(roi, "roi",
      "decode only the crop's part of a JPEG, at the smallest DCT scale that keeps its shorter "
      "side >= size; false: decode whole images (for comparison)");
    d(check_whole_file, "check_whole_file",
      "roi: once: the first view of each file (by path and size) decodes it to the end, so "
      "damage anywhere in it is found and the file skipped in every epoch, and its later views "
      "stop below their crop (the same pixels, less entropy decoding); every_view: every view "
      "decodes to the end");
    d(mcu_index_mb, "mcu_index_mb",
      "roi with check_whole_file: once: memory (MiB, about) for files that their second view "
      "re-encodes losslessly with a restart marker after every MCU (the same coefficients, so "
      "the same pixels); that view and the later ones entropy-decode only the crop's MCUs. "
      "Indexing costs about 1.5 whole decodes per file, paid back from about the 5th view. "
      "Files past it stop below their crop instead. 0: off",
      {.min = 0, .max = std::int64_t{1} << 40});
    augment.declare(d);
    decode.declare(d);
    normalize.declare(d);
    pool.declare(d);
  }
};

/// decode + augment + collate's copy, fused (DALI's `decoders.image_random_crop` with
/// `crop_mirror_normalize`): draws the sample's view from its JPEG header, decodes only the
/// crop's part of the image (JpegCropDecoder) at the DCT scale its size allows, renders the view
/// exactly as `augment` does (resize, flip, jitter), and writes it normalised, with its label and
/// targets, straight into its row of a pooled batch buffer. Workers run in parallel, each on its
/// own row; `assemble_batch` after it emits each batch once its rows are in, in order.
///
/// Sample n of the stage's input goes to row n % batch_size of batch n / batch_size, so the
/// batches hold the samples `collate` would give them. A sample that cannot be decoded is
/// dropped (BadSamplePolicy) and leaves its batch one row shorter: the batch count does not
/// depend on drops. Images this decoder does not take (other formats, CMYK, any libjpeg warning)
/// are decoded whole with `decode_image`, which also names the reason of a refusal; with
/// `roi: false` every image is.
///
/// The view is drawn with the aspect ratio of the full-size image, as `augment` does after a
/// full-size decode.
///
/// Damage below a view's crop leaves its pixels alone, but the file is still bad: the first
/// view of each file reads its entropy data to the end (check_whole_file: once), and a file
/// found whole is remembered. Its next view re-encodes it with a restart marker after every MCU
/// (McuIndexedJpeg, kept up to mcu_index_mb), so that view and the later ones decode only their
/// crop's MCUs; past that budget, its later views stop after their crop's last row. (A run of
/// one epoch never pays for an index.) A damaged file is never remembered or kept: each of its
/// views reads to the end and is dropped, as before.
class DecodeCropStage final : public Map<Sample, BatchRow> {
 public:
  using Options = DecodeCropOptions;
  /// `context`: the run's services; its process group (dist::World) if the run is a rank of
  /// a job.
  explicit DecodeCropStage(const Options& options, const BuildContext& context = {});
  static StageDoc describe();
  /// Throws Error on params the constructor would refuse (its crop's scale, its std).
  static void check(const Options& options) {
    AugmentPolicy{options.augment.policy()};
    Normalizer{options.normalize};
  }
  /// "replaced": bad samples that stand-ins took the place of (on_bad_sample: replace);
  /// "stopped_below_crop": views decoded only to their crop's last row (a file checked whole);
  /// "views_from_index", "indexed_files", "index_mb": views decoded from a file's
  /// McuIndexedJpeg (its second view on), the files kept so, and the memory they hold.
  std::vector<StageResult> results() const override;

  BatchPool::Stats pool_stats() const { return pool_->stats(); }
  /// Waits for a free batch buffer (BatchPool::waiting).
  StageWait waiting() const override { return pool_->waiting(); }

 protected:
  std::optional<BatchRow> process(Sample&& sample, ItemContext& ctx) override;

 private:
  /// The buffers of batch `batch`, leased from the pool by its first row to arrive.
  std::shared_ptr<BatchBuffers> buffers_for(std::uint64_t batch, const Sample& sample);

  DecodeOptions decode_;
  BadSamplePolicy policy_;
  AugmentPolicy augment_;
  int size_;
  bool roi_;
  Normalizer normalize_;
  std::uint64_t recipe_;  // ViewKey::recipe of every row: the params that shape its pixels
  std::int64_t batch_size_;
  double wait_timeout_s_;
  std::shared_ptr<BatchPool> pool_;
  bool check_once_;
  std::int64_t index_budget_;  // bytes
  /// Files (hash of path and byte count) kept re-encoded, and the bytes they hold.
  tbb::concurrent_unordered_map<std::uint64_t, std::unique_ptr<const McuIndexedJpeg>> indexed_;
  std::atomic<std::int64_t> index_bytes_{0};
  std::atomic<std::uint64_t> views_from_index_{0};
  /// Files (hash of path and byte count) a view decoded to the end without a problem.
  tbb::concurrent_unordered_set<std::uint64_t> checked_files_;
  std::atomic<std::uint64_t> stopped_below_crop_{0};

  std::mutex open_mutex_;
  /// Batches being filled: their number and buffers, held weakly (their rows hold them).
  std::vector<std::pair<std::uint64_t, std::weak_ptr<BatchBuffers>>> open_;
  std::int64_t targets_ = -1;  // target count, fixed by the first sample (under open_mutex_)
};

}  // namespace flowtrain::data
