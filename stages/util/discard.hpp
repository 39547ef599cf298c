#pragma once

#include "graph/registry.hpp"

namespace flowtrain::stages {

/// Sink that accepts items of any type and discards them: ends a pipeline whose report, not its
/// output, is the point (benchmarks, examples).
class DiscardSink final : public Sink<Anything> {
 public:
  using Options = NoOptions;
  explicit DiscardSink(const Options& = {}) {}
  static StageDoc describe();

 protected:
  void consume(Anything&& item, ItemContext& ctx) override;
};

}  // namespace flowtrain::stages
