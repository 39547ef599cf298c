#pragma once

// Internal to graph/: what outlives one run of a Pipeline (runtime.cpp runs it; pipeline.cpp
// reads its counters). Not part of the API.

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "graph/metrics.hpp"
#include "graph/pipeline.hpp"

namespace flowtrain {

// What outlives one run of a pipeline, so that a paused run continues exactly: each stage's
// counters (the report covers every run), the next sequence number of each numbering stage,
// the drop log and the wall time of the runs before.
struct Pipeline::RunState {
  std::size_t source = 0;  // the stage the graph pulls: the source, or the mix
  std::vector<std::unique_ptr<detail::StageCounters>> counters;
  // Next sequence number a source, mix or FlatMap assigns (all are serial).
  std::vector<std::uint64_t> next_seq;
  std::optional<detail::DropLog> drop_log;  // the stages' counters point to it
  double earlier_wall_s = 0;                // of the paused runs before this one
  CpuReport earlier_cpu;                    // of the same runs (detail::append_cpu)

  RunState(const std::vector<Node>& nodes, const RunOptions& options) : next_seq(nodes.size(), 0) {
    const auto mix = std::find_if(nodes.begin(), nodes.end(), [](const Node& n) {
      return n.shape.kind == StageShape::Kind::kMix;
    });
    if (mix != nodes.end()) source = static_cast<std::size_t>(mix - nodes.begin());
    if (!options.drops_path.empty()) drop_log.emplace(options.drops_path);
    for (const Node& node : nodes) {
      counters.push_back(std::make_unique<detail::StageCounters>());
      counters.back()->name = node.name;
      if (drop_log) counters.back()->drop_log = &*drop_log;
    }
  }
};

}  // namespace flowtrain
