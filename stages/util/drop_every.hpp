#pragma once

#include <cstdint>
#include <optional>

#include "graph/registry.hpp"

namespace flowtrain::stages {

struct DropEveryOptions {
  std::int64_t every = 0;
  template <class Declare>
  void declare(Declare& d) {
    d(every, "every", "drop items 0, every, 2*every, ... (0: drop none)", {.min = 0});
  }
};

/// Drops every item whose sequence number is a multiple of `every` (0: none), with a reason:
/// shows and tests how dropped items are counted and reported.
class DropEveryStage final : public Map<std::uint64_t, std::uint64_t> {
 public:
  using Options = DropEveryOptions;
  explicit DropEveryStage(const Options& options);
  static StageDoc describe();

 protected:
  std::optional<std::uint64_t> process(std::uint64_t&& value, ItemContext& ctx) override;

 private:
  std::uint64_t every_;
};

}  // namespace flowtrain::stages
