#pragma once

// Internal to graph/'s config rooms: phases that extend others, composed into plain ones.

#include <yaml-cpp/yaml.h>

#include <cstddef>
#include <memory>

#include "graph/config/yaml_values.hpp"
#include "graph/registry.hpp"

namespace flowtrain::detail {

// Composition: a phase that says `extends: BASE` is BASE's stages (after the command-line
// overrides, so an override of BASE reaches it), less those its `without` names, with what its
// `stages` map gives per stage name merged over them (params key by key, other keys replacing
// the base's) and stages with a `type` of their own added or put in place (Hydra's defaults
// list with overrides, by stage name). The composed phase is a YAML map like a plain phase's,
// built of the very nodes of the config, so validate_pipeline reads it as any other and every
// message names the line (or the override) that set the value.
class PhaseComposer {
 public:
  // The most phases a chain of `extends` may hold: composing recurses down the chain, and the
  // Locator's lookups grow with each phase composed (1000 deep took 3.2 GB).
  static constexpr std::size_t kMaxChain = 32;

  /// `phases`: the config's `phases` list; `loc` names the lines of what the phases compose.
  PhaseComposer(const YAML::Node& phases, Locator& loc, const Registry& registry);
  ~PhaseComposer();

  /// Phase `i` as validate_pipeline reads it: its own entry, or the phase composed from its base.
  YAML::Node phase(std::size_t i);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace flowtrain::detail
