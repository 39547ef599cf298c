#pragma once

#include "graph/registry.hpp"

namespace flowtrain::stages {

/// Sink that accepts items of any type and discards them: ends a pipeline whose report, not its
/// output, is the point (benchmarks, examples).
class DiscardSink final : public Sink<Anything> {
 public:
  explicit DiscardSink(const Params& params);
  static StageDoc describe();

 protected:
  void consume(Anything&& item, ItemContext& ctx) override;
};

}  // namespace flowtrain::stages
