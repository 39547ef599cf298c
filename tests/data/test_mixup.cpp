#include <torch/torch.h>
// After LibTorch, whose glog has a CHECK of its own.
#include <doctest/doctest.h>

#include <cmath>

#include "graph/error.hpp"
#include "stages/data/transforms/mixup.hpp"

using namespace flowtrain;
using namespace flowtrain::data;

namespace {

// A batch of `rows` images, row r filled with r + 1 (channel c adds 100 c), label r, target 10 r,
// the view of sample 100 + r in epoch 2.
Batch numbered_batch(std::int64_t rows) {
  Batch batch;
  batch.images = torch::empty({rows, 3, 8, 8});
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < 3; ++c) batch.images[r][c].fill_(static_cast<double>(r + 1 + 100 * c));
  }
  batch.labels = torch::arange(rows, torch::kLong);
  batch.targets = torch::arange(rows, torch::kFloat).mul(10).unsqueeze(1);
  for (std::int64_t r = 0; r < rows; ++r) {
    ViewKey view;
    view.index = 100 + static_cast<std::uint64_t>(r);
    view.epoch = 2;
    batch.views.push_back(view);
    batch.paths.push_back("photo" + std::to_string(r) + ".jpg");
  }
  return batch;
}

}  // namespace

TEST_CASE("Data.Mixup.RowsBlendWithTheFlippedBatchAsDrawn") {
  const MixupOptions options{.mixup_alpha = 0.8, .cutmix_alpha = 1.0, .seed = 7};
  Batch batch = numbered_batch(5);
  const Batch original = numbered_batch(5);
  mix_batch(options, batch);
  REQUIRE(batch.label_mix.defined());
  CHECK(torch::equal(batch.mix_partner, torch::tensor({4, 3, 2, 1, 0}, torch::kLong)));
  int cutmixes = 0, mixups = 0;
  for (std::int64_t i = 0; i < 5; ++i) {
    CAPTURE(i);
    const std::int64_t j = 4 - i;
    const MixParams mix = i == j ? MixParams{} : draw_mix(options, 2, 100 + i, 8, 8);
    const double own = batch.label_mix[i].item<double>();
    CHECK(own == doctest::Approx(mix.own).epsilon(1e-6));
    const torch::Tensor mine = original.images[i], theirs = original.images[j];
    torch::Tensor expected = mine.clone();
    if (mix.mixed && mix.cutmix) {
      ++cutmixes;
      expected.slice(1, mix.y0, mix.y1).slice(2, mix.x0, mix.x1).copy_(
          theirs.slice(1, mix.y0, mix.y1).slice(2, mix.x0, mix.x1));
      // The share is the area outside the box.
      const double outside = (batch.images[i] == mine).to(torch::kFloat).mean().item<double>();
      CHECK(outside == doctest::Approx(own));
    } else if (mix.mixed) {
      ++mixups;
      expected = mine * own + theirs * (1 - own);
    }
    CHECK(torch::allclose(batch.images[i], expected, 1e-5, 1e-4));
    CHECK(batch.targets[i][0].item<double>() ==
          doctest::Approx(10.0 * i * own + 10.0 * j * (1 - own)).epsilon(1e-5));
    // The view key of a mixed row changes (its partner and the draw), of the middle row not.
    CHECK((batch.views[static_cast<std::size_t>(i)].mix != 0) == mix.mixed);
  }
  CHECK(mixups + cutmixes == 4);
  CHECK(batch.label_mix[2].item<double>() == 1.0);
  CHECK(torch::equal(batch.images[2], original.images[2]));

  // Deterministic: the same batch mixes the same way; another seed does not.
  Batch again = numbered_batch(5);
  mix_batch(options, again);
  CHECK(torch::equal(again.images, batch.images));
  CHECK((again.views == batch.views));
  Batch other = numbered_batch(5);
  mix_batch({.mixup_alpha = 0.8, .cutmix_alpha = 1.0, .seed = 8}, other);
  CHECK_FALSE(torch::equal(other.images, batch.images));
}

TEST_CASE("Data.Mixup.DrawsFollowTheOptions") {
  int cutmix = 0, mixed = 0;
  for (std::uint64_t index = 0; index < 400; ++index) {
    const MixParams only_mixup = draw_mix({.mixup_alpha = 0.4, .cutmix_alpha = 0}, 0, index, 16, 16);
    CHECK(only_mixup.mixed);
    CHECK_FALSE(only_mixup.cutmix);
    CHECK((only_mixup.own > 0 && only_mixup.own < 1));
    const MixParams half = draw_mix({.prob = 0.5, .seed = 1}, 3, index, 16, 16);
    mixed += half.mixed;
    cutmix += half.mixed && half.cutmix;
    if (half.cutmix) {
      CHECK((0 <= half.y0 && half.y0 <= half.y1 && half.y1 <= 16));
      CHECK((0 <= half.x0 && half.x0 <= half.x1 && half.x1 <= 16));
    }
  }
  // prob 0.5 and switch_prob 0.5: about half mixed, about half of those by cutmix.
  CHECK(mixed > 150);
  CHECK(mixed < 250);
  CHECK(cutmix > mixed / 4);
  CHECK(cutmix < 3 * mixed / 4);
  CHECK_THROWS_WITH_AS(MixupStage({.mixup_alpha = 0, .cutmix_alpha = 0}),
                       "mixup_alpha and cutmix_alpha are both 0: nothing would be mixed", Error);
  Batch no_views = numbered_batch(2);
  no_views.views.clear();
  CHECK_THROWS_AS(mix_batch({}, no_views), Error);
}
