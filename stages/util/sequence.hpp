#pragma once

#include <cstdint>
#include <optional>

#include "graph/registry.hpp"

namespace flowtrain::stages {

/// Source of the integers start, start+1, ..., start+count-1: the simplest data for examples,
/// tests and the framework-overhead benchmark.
struct SequenceOptions {
  std::int64_t count = 10000;
  std::int64_t start = 0;
  template <class Declare>
  void declare(Declare& d) {
    d(count, "count", "how many integers to emit", {.min = 0});
    d(start, "start", "the first integer", {.min = 0});
  }
};

class SequenceSource final : public Source<std::uint64_t> {
 public:
  using Options = SequenceOptions;
  explicit SequenceSource(const Options& options);
  static StageDoc describe();

 protected:
  std::optional<std::uint64_t> next() override;

 private:
  std::uint64_t next_;
  std::uint64_t end_;
};

}  // namespace flowtrain::stages
