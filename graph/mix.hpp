#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "graph/options.hpp"
#include "graph/registry.hpp"

namespace flowtrain {

struct MixOptions {
  std::vector<double> weights = {};
  std::int64_t seed = 0;
  bool stop_on_first_empty = false;
  template <class Declare>
  void declare(Declare& d) {
    d(weights, "weights", "share of each input, in the order of `inputs` (empty: equal shares)");
    d(seed, "seed", "seed of the choice of input for each item", {.min = 0});
    d(stop_on_first_empty, "stop_on_first_empty",
      "end when any input is exhausted (else go on with the others, their weights rescaled)");
  }
};

/// Built in as stage type `mix`: a source made of two or more sources (its inputs), like
/// tf.data's sample_from_datasets. Item k comes from the input `pick(k)` chooses: random with
/// the given weights, from (seed, k) only, so the mixed order is the same on every run and a
/// resumed run continues it. The runtime pulls the chosen source; the mix runs no code of its
/// own. Sources come first in a pipeline; the mix takes them all:
///
///   - {name: food, type: csv_manifest, params: {manifest: food.csv}}
///   - {name: extra, type: csv_manifest, params: {manifest: extra.csv}}
///   - {name: data, type: mix, inputs: [food, extra], params: {weights: [0.8, 0.2], seed: 1}}
class MixStage final : public Stage {
 public:
  using Options = MixOptions;
  explicit MixStage(const Options& options);
  static StageDoc describe();
  static StageShape static_shape() {
    return {StageShape::Kind::kMix, ItemType::of<Anything>(), ItemType::of<SameAsInputs>(),
            kSerial};
  }
  StageShape shape() const override { return static_shape(); }
  std::optional<std::uint64_t> plan(std::optional<std::uint64_t> inputs) override {
    return inputs;
  }

  /// Resumes the mix's order at item `position` (the pipeline seeks its inputs to match).
  bool seek(std::uint64_t position) override {
    start_ = position;
    return true;
  }

  /// Throws Error if the weights do not suit `inputs` inputs (one each, >= 0, not all 0).
  void check_inputs(const std::string& name, std::size_t inputs) const;

  /// The input item `k` of this run (after a seek: of the resumed part) comes from, among the
  /// inputs still `alive`; std::nullopt when the mix ends (none alive, or one exhausted with
  /// stop_on_first_empty).
  std::optional<std::size_t> pick(std::uint64_t k, const std::vector<bool>& alive) const;
  /// Where item `k` of this run stands in the whole mixed order: what a run resumed after it
  /// seeks to (a source's items carry it, Source::mixed_at).
  std::uint64_t position(std::uint64_t k) const { return start_ + k; }

  /// How many items each input gave to the first `position` items of the mix, given each
  /// input's size; std::nullopt if a size is unknown (then a run cannot resume mid-way).
  std::optional<std::vector<std::uint64_t>> split(
      std::uint64_t position, const std::vector<std::optional<std::uint64_t>>& sizes) const;

 private:
  // Chooses item k of the whole mixed order.
  std::optional<std::size_t> choose(std::uint64_t k, const std::vector<bool>& alive) const;

  Options options_;
  std::uint64_t start_ = 0;  // the first item of this run in the whole order (seek)
};

}  // namespace flowtrain
