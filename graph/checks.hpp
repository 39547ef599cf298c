#pragma once

// Internal to graph/: the helpers of the graph checks (checks.cpp) that the runtime and the
// pipeline use too. Not part of the API.

#include <cstddef>
#include <vector>

#include "graph/layout.hpp"

namespace flowtrain::detail {

/// True for the stages the runtime pulls rather than feeds: sources and a mix of sources.
inline bool pulled(StageShape::Kind kind) {
  return kind == StageShape::Kind::kSource || kind == StageShape::Kind::kMix;
}
/// True for the stages with one input port per input: joins and merges.
inline bool has_ports(StageShape::Kind kind) {
  return kind == StageShape::Kind::kJoin || kind == StageShape::Kind::kMerge;
}

/// The inputs of `stages[i]` resolved to stage indices (its own list, or the stage before it).
std::vector<InputLink> links_of(const std::vector<StageDecl>& stages, std::size_t i);
/// The stage whose sequence numbers `stages[i]`'s items carry (a source, mix or flat map).
std::size_t numbered_by(const std::vector<StageDecl>& stages, std::size_t i);
/// The item type stage `p` emits (a merge's: its inputs').
ItemType emitted(const std::vector<StageDecl>& stages, std::size_t p);
/// The items stage `i` may have in production or waiting: its consumers' smallest queue.
std::size_t out_capacity(const std::vector<StageDecl>& stages, std::size_t i);
/// The workers of a stage of `concurrency` that `threads` graph threads and `slots` can keep busy.
std::size_t reachable_workers(std::size_t concurrency, std::size_t threads, std::size_t slots);

}  // namespace flowtrain::detail
