#pragma once

// Internal to graph/'s config rooms: the config as text. Reading it (the overrides, `${cwd}`
// and `${key}` references, checks of its YAML structure) and writing the effective config back.

#include <yaml-cpp/yaml.h>

#include <string>
#include <vector>

#include "graph/config.hpp"
#include "graph/config/yaml_values.hpp"

namespace flowtrain::detail {

/// The config file's text; refuses a file past 4 MiB.
std::string read_config_file(const std::string& path);

/// Reads config text, applies the overrides, then `${cwd}` and the `${...}` key references.
/// `references`, if given, receives the config as it was before the key references.
YAML::Node load_root(const std::string& text,
                     const std::string& origin,
                     const std::vector<std::string>& overrides,
                     Locator& loc,
                     YAML::Node* references = nullptr);

/// Writes every path param the config gives as the absolute form of its resolved value, so the
/// effective text does not depend on the folder it is read from.
void write_resolved_paths(const YAML::Node& root,
                          const RunConfig& config,
                          const Registry& registry,
                          const std::vector<ConfigSection>& sections);

/// The YAML of the config after overrides, headed by a comment saying where it came from. A
/// value that refers to another key (`${output.dir}/teacher`) keeps the reference, so a run
/// started from the saved text with `output.dir=OTHER` writes to OTHER, not to this run's folder.
std::string effective_text(const YAML::Node& root,
                           const YAML::Node& references,
                           const std::string& origin,
                           const std::vector<std::string>& overrides);

}  // namespace flowtrain::detail
