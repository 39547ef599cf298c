#pragma once

#include <cstdint>
#include <optional>

#include "graph/registry.hpp"

namespace flowtrain::stages {

/// Pure CPU work of a chosen cost: applies `rounds` rounds of a 64-bit mixing function to each
/// integer (about 4 ns per round on this machine). Stands in for decode or augment work in
/// examples.
struct SpinOptions {
  std::int64_t rounds = 20000;
  template <class Declare>
  void declare(Declare& d) {
    d(rounds, "rounds", "mixing rounds per item", {.min = 0});
  }
};

class SpinStage final : public Map<std::uint64_t, std::uint64_t> {
 public:
  using Options = SpinOptions;
  explicit SpinStage(const Options& options);
  static StageDoc describe();

  /// The value the stage emits for `value`: the mixing function applied `rounds` times.
  static std::uint64_t mix(std::uint64_t value, std::int64_t rounds);

 protected:
  std::optional<std::uint64_t> process(std::uint64_t&& value, ItemContext& ctx) override;

 private:
  std::int64_t rounds_;
};

}  // namespace flowtrain::stages
