#pragma once

#include <cstdint>
#include <optional>

#include "graph/registry.hpp"

namespace flowtrain::stages {

/// A router: sends each item whose sequence number is a multiple of `every` to its output
/// `picked`, the others to `rest`. Shows and tests routing around a stage and `merge`:
///
///   - {type: route_every, name: split, params: {every: 4}}
///   - {type: spin, inputs: split.picked}
///   - {type: merge, inputs: [split.rest, spin]}
struct RouteEveryOptions {
  std::int64_t every = 2;
  template <class Declare>
  void declare(Declare& d) {
    d(every, "every", "route items 0, every, 2*every, ... to `picked`", {.min = 1});
  }
};

class RouteEveryStage final : public Router<std::uint64_t, std::uint64_t> {
 public:
  using Options = RouteEveryOptions;
  explicit RouteEveryStage(const Options& options);
  static StageDoc describe();
  static StageShape static_shape() { return shape_with_outputs({"picked", "rest"}); }
  StageShape shape() const override { return static_shape(); }

 protected:
  std::optional<Routed<std::uint64_t>> process(std::uint64_t&& value, ItemContext& ctx) override;

 private:
  std::uint64_t every_;
};

}  // namespace flowtrain::stages
