#pragma once

// Internal to graph/'s config rooms: a config's entries as the nodes they bring
// (StageInfo::expand). No YAML here.

#include <string>

#include "graph/config.hpp"

namespace flowtrain::detail {

/// The registered type of `stage`; refuses one the registry lacks, naming its line.
const StageInfo& registered(const StageConfig& stage, const Registry& registry);

/// The node that carries the output of the entry named `name` (the last of the nodes it always
/// brings, StageInfo::expand), or `name` itself.
std::string entry_output(const PipelineConfig& config,
                         const Registry& registry,
                         const std::string& name);

}  // namespace flowtrain::detail
