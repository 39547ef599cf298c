#pragma once

#include <cstdint>
#include <optional>

#include "graph/registry.hpp"

namespace flowtrain::stages {

/// Source of the integers start, start+1, ..., start+count-1: the simplest data for examples,
/// tests and the framework-overhead benchmark.
class SequenceSource final : public Source<std::uint64_t> {
 public:
  explicit SequenceSource(const Params& params);
  static StageDoc describe();

 protected:
  std::optional<std::uint64_t> next() override;

 private:
  std::uint64_t next_;
  std::uint64_t end_;
};

}  // namespace flowtrain::stages
