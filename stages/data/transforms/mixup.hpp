#pragma once

#include <cstdint>

#include "graph/registry.hpp"
#include "stages/data/batch.hpp"

namespace flowtrain::data {

struct MixupOptions {
  double mixup_alpha = 0.8;
  double cutmix_alpha = 1.0;
  double switch_prob = 0.5;
  double prob = 1.0;
  std::uint64_t seed = 0;
  template <class Declare>
  void declare(Declare& d) {
    d(mixup_alpha, "mixup_alpha",
      "mixup: the weight of a row's own image is drawn from Beta(a, a) (0: no mixup)", {.min = 0});
    d(cutmix_alpha, "cutmix_alpha",
      "cutmix: the share of a row's own image outside the pasted box is drawn from Beta(a, a) "
      "(0: no cutmix)",
      {.min = 0});
    d(switch_prob, "switch_prob", "with both: the chance a mixed row uses cutmix",
      {.min = 0, .max = 1});
    d(prob, "prob", "the chance a row is mixed at all", {.min = 0, .max = 1});
    d(seed, "seed", "seed of the draws (with each row's epoch and index)", {.min = 0});
  }
};

/// How one row of a batch is mixed with its partner, as drawn from (seed, epoch, index).
struct MixParams {
  bool mixed = false;
  bool cutmix = false;
  double own = 1.0;  // the share of the row's own image (and label) in the result
  // cutmix: the box, in pixels, that takes the partner's pixels
  std::int64_t y0 = 0, y1 = 0, x0 = 0, x1 = 0;
};

/// The draw of row (epoch, index) for images of height x width: a pure function, so that a
/// cache key, a test or a resumed run finds the same mix.
MixParams draw_mix(const MixupOptions& options,
                   std::uint32_t epoch,
                   std::uint64_t index,
                   std::int64_t height,
                   std::int64_t width);

/// Mixes `batch` in place as MixupStage describes; throws Error if a row has no view key. Pure
/// but for the batch: the same batch and options give the same result.
///
///   mix_batch({.mixup_alpha = 0.8, .cutmix_alpha = 1.0, .seed = 3}, batch);
///   // batch.label_mix[i]: row i's own share; batch.mix_partner[i] == B - 1 - i
void mix_batch(const MixupOptions& options, Batch& batch);

/// Mixup (Zhang et al. 2018) and CutMix (Yun et al. 2019) on assembled batches, in place, as
/// timm's Mixup does it: row i is mixed with row B-1-i (the batch flipped), by a blend of both
/// images (mixup) or by pasting a box of the partner into it (cutmix), the share of its own
/// image drawn per row from (seed, epoch, index) like augment's parameters. The batch then
/// carries `label_mix` (each row's own share) and `mix_partner`, which the training step turns
/// into mixed label targets (the regression targets are mixed in place), and each row's view key
/// gets a digest of its partner's view and the mix, so a teacher cache keys the mixed image. Put
/// it after batch assembly and before the teacher: teacher and student see the same mixed view.
///
///   source -> decode_crop -> assemble_batch -> mixup -> teacher_infer -> train_step
class MixupStage final : public Map<Batch, Batch> {
 public:
  using Options = MixupOptions;
  explicit MixupStage(const Options& options);
  static StageDoc describe();

 protected:
  std::optional<Batch> process(Batch&& batch, ItemContext& ctx) override;

 private:
  Options options_;
};

}  // namespace flowtrain::data
