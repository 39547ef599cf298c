#pragma once

// Per-item stage spans for a Chrome trace-event JSON (opens in Perfetto or chrome://tracing).
// Internal to graph/.

#include <oneapi/tbb/enumerable_thread_specific.h>

#include <cstdint>
#include <string>
#include <vector>

#include "graph/metrics.hpp"
#include "graph/report.hpp"

namespace flowtrain::detail {

class TraceRecorder {
 public:
  explicit TraceRecorder(Clock::time_point start) : start_(start) {}

  /// Records one invocation of stage `stage` on item `seq`. Lock-free: one buffer per thread.
  void span(std::uint32_t stage, std::uint64_t seq, Clock::time_point begin, Clock::time_point end);

  /// Writes spans and the sampled queue occupancy of `report` as trace-event JSON.
  /// Throws Error naming the path if it cannot be written.
  void write(const std::string& path, const RunReport& report) const;

 private:
  struct Span {
    std::uint32_t stage;
    std::uint64_t seq;
    std::int64_t begin_ns;
    std::int64_t end_ns;
  };
  Clock::time_point start_;
  tbb::enumerable_thread_specific<std::vector<Span>> spans_;
};

}  // namespace flowtrain::detail
