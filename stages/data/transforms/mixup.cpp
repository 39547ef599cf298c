#include "stages/data/transforms/mixup.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "graph/error.hpp"
#include "stages/data/splitmix.hpp"

namespace flowtrain::data {

namespace {

// Beta(a, a) from two gamma draws.
double beta(std::mt19937_64& rng, double a) {
  std::gamma_distribution<double> gamma(a, 1.0);
  const double x = gamma(rng);
  const double y = gamma(rng);
  return x + y > 0 ? x / (x + y) : 0.5;
}

// The digest of how a row was mixed: its partner's exact view and the draw.
std::uint64_t mix_digest(const std::string& partner_path,
                         const ViewKey& partner,
                         const MixParams& mix) {
  std::uint64_t h = hash_bytes({reinterpret_cast<const std::uint8_t*>(partner_path.data()),
                                partner_path.size()});
  for (const std::uint64_t word :
       {partner.index, std::uint64_t{partner.epoch}, partner.recipe, partner.mix,
        std::uint64_t{mix.cutmix}, static_cast<std::uint64_t>(mix.y0),
        static_cast<std::uint64_t>(mix.y1), static_cast<std::uint64_t>(mix.x0),
        static_cast<std::uint64_t>(mix.x1)}) {
    h = splitmix64(h ^ word);
  }
  const AugmentParams& a = partner.augment;
  // Field by field: the struct's padding bytes are not part of the view.
  for (const float v : {a.crop_x, a.crop_y, a.crop_w, a.crop_h, a.brightness, a.contrast,
                        a.saturation}) {
    std::uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    h = splitmix64(h ^ bits);
  }
  std::uint64_t own;
  std::memcpy(&own, &mix.own, sizeof own);
  return splitmix64(h ^ own ^ (std::uint64_t{a.flip} << 63));
}

// Row `to` of `images` mixed with `from` as `mix` says, in place.
void apply(const torch::Tensor& to, const torch::Tensor& from, const MixParams& mix) {
  if (!mix.mixed) return;
  if (mix.cutmix) {
    to.slice(1, mix.y0, mix.y1).slice(2, mix.x0, mix.x1).copy_(
        from.slice(1, mix.y0, mix.y1).slice(2, mix.x0, mix.x1));
  } else {
    to.mul_(mix.own).add_(from, 1.0 - mix.own);
  }
}

}  // namespace

MixParams draw_mix(const MixupOptions& o,
                   std::uint32_t epoch,
                   std::uint64_t index,
                   std::int64_t height,
                   std::int64_t width) {
  MixParams p;
  if (o.mixup_alpha <= 0 && o.cutmix_alpha <= 0) return p;
  std::mt19937_64 rng(splitmix64(o.seed ^ splitmix64(std::uint64_t{epoch} ^ splitmix64(index))));
  std::uniform_real_distribution<double> unit(0, 1);
  if (unit(rng) >= o.prob) return p;
  p.mixed = true;
  p.cutmix = o.mixup_alpha <= 0 || (o.cutmix_alpha > 0 && unit(rng) < o.switch_prob);
  if (!p.cutmix) {
    p.own = beta(rng, o.mixup_alpha);
    return p;
  }
  // timm's rand_bbox: a box of sides sqrt(1 - lambda) times the image's, centred anywhere,
  // clipped to the image; the own share is then what the box leaves.
  const double lambda = beta(rng, o.cutmix_alpha);
  const double ratio = std::sqrt(1.0 - lambda);
  const auto cut_h = static_cast<std::int64_t>(static_cast<double>(height) * ratio);
  const auto cut_w = static_cast<std::int64_t>(static_cast<double>(width) * ratio);
  const auto cy = static_cast<std::int64_t>(unit(rng) * static_cast<double>(height));
  const auto cx = static_cast<std::int64_t>(unit(rng) * static_cast<double>(width));
  p.y0 = std::clamp<std::int64_t>(cy - cut_h / 2, 0, height);
  p.y1 = std::clamp<std::int64_t>(cy + cut_h / 2, 0, height);
  p.x0 = std::clamp<std::int64_t>(cx - cut_w / 2, 0, width);
  p.x1 = std::clamp<std::int64_t>(cx + cut_w / 2, 0, width);
  p.own = 1.0 - static_cast<double>((p.y1 - p.y0) * (p.x1 - p.x0)) /
                    static_cast<double>(height * width);
  if (p.own == 1.0) p.mixed = false;  // an empty box
  return p;
}

MixupStage::MixupStage(const Options& options) : options_(options) {
  if (options.mixup_alpha <= 0 && options.cutmix_alpha <= 0) {
    throw Error("mixup_alpha and cutmix_alpha are both 0: nothing would be mixed");
  }
}

StageDoc MixupStage::describe() {
  return {"Mixup and CutMix on assembled batches, in place, as timm does them (row i with row "
          "B-1-i), drawn per row from (seed, epoch, index); the batch carries the label mix for "
          "the training step, and each row's view key its partner's view, so a teacher cache "
          "keys the mixed image. Put it before the teacher: both see the same mixed view.",
          option_specs<Options>()};
}

std::optional<Batch> MixupStage::process(Batch&& batch, ItemContext&) {
  mix_batch(options_, batch);
  return std::move(batch);
}

void mix_batch(const MixupOptions& options, Batch& batch) {
  const std::int64_t rows = batch.size();
  if (rows == 0) return;
  if (batch.views.size() != static_cast<std::size_t>(rows)) {
    throw Error("the batch has no view key for every row (mixup draws from each row's epoch and "
                "index): take batches from assemble_batch or collate");
  }
  torch::NoGradGuard no_grad;
  const torch::Tensor& images = batch.images;
  const std::int64_t height = images.size(2), width = images.size(3);
  std::vector<MixParams> mix(static_cast<std::size_t>(rows));
  for (std::int64_t i = 0; i < rows; ++i) {
    const ViewKey& v = batch.views[static_cast<std::size_t>(i)];
    // The middle row of an odd batch is its own partner: left as it is.
    if (i != rows - 1 - i) mix[static_cast<std::size_t>(i)] = draw_mix(options, v.epoch, v.index, height, width);
  }
  torch::Tensor own = torch::ones({rows}, torch::kFloat);
  torch::Tensor partner = torch::arange(rows - 1, -1, -1, torch::kLong);
  const bool targets = batch.targets.defined() && batch.targets.numel() > 0;
  torch::Tensor saved = torch::empty_like(images[0]);
  const torch::Tensor original_targets = targets ? batch.targets.clone() : torch::Tensor();
  for (std::int64_t i = 0; i < rows / 2; ++i) {
    const std::int64_t j = rows - 1 - i;
    const MixParams& mi = mix[static_cast<std::size_t>(i)];
    const MixParams& mj = mix[static_cast<std::size_t>(j)];
    // Row i first, from row j as it was; then row j, from row i as it was (saved).
    saved.copy_(images[i]);
    apply(images[i], images[j], mi);
    apply(images[j], saved, mj);
    if (targets) {
      if (mi.mixed) batch.targets[i].mul_(mi.own).add_(original_targets[j], 1.0 - mi.own);
      if (mj.mixed) batch.targets[j].mul_(mj.own).add_(original_targets[i], 1.0 - mj.own);
    }
  }
  // The keys after every row's partner key was read unmixed.
  std::vector<std::uint64_t> digests(static_cast<std::size_t>(rows), 0);
  for (std::int64_t i = 0; i < rows; ++i) {
    const auto k = static_cast<std::size_t>(i);
    if (!mix[k].mixed) continue;
    own[i] = mix[k].own;
    const auto p = static_cast<std::size_t>(rows - 1 - i);
    digests[k] = mix_digest(batch.paths.size() > p ? batch.paths[p] : std::string(), batch.views[p],
                            mix[k]);
  }
  for (std::size_t k = 0; k < digests.size(); ++k) {
    if (digests[k] != 0) batch.views[k].mix = digests[k];
  }
  batch.label_mix = own;
  batch.mix_partner = partner;
}

FLOWTRAIN_REGISTER_STAGE("mixup", MixupStage);

}  // namespace flowtrain::data
