#pragma once

// Internal to graph/'s config rooms: YAML nodes read as the values a config declares, and the
// Locator that names where each came from. Not installed: yaml-cpp is graph/'s private
// dependency.

#include <yaml-cpp/yaml.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "graph/error.hpp"
#include "graph/params.hpp"

namespace flowtrain::detail {

/// The keys a stage entry may have.
inline const std::vector<std::string> kStageKeys = {
    "type", "name", "params", "concurrency", "queue_capacity", "ordered", "inputs", "token_from"};

// Turns YAML nodes into "file:line" (or the override that set them) for messages.
class Locator {
 public:
  explicit Locator(std::string origin) : origin_(std::move(origin)) {}

  // The handles stay: they keep the nodes they name alive (yaml-cpp frees a node whose last
  // handle goes, and may reuse its memory for a node the config still holds).
  void add_override(const YAML::Node& node, std::string text) {
    overrides_.emplace_back(node, std::move(text));
  }

  bool is_override(const YAML::Node& node) const { return override_of(node) != nullptr; }

  // The override that set `node` last, if one did (`epochs=1 epochs=0`: the second).
  const std::string* override_of(const YAML::Node& node) const {
    for (auto it = overrides_.rbegin(); it != overrides_.rend(); ++it) {
      if (it->first.is(node)) return &it->second;
    }
    return nullptr;
  }

  // `made` (a node the loader built, with no line of its own: a composed phase's merged stage)
  // is reported where `original` is.
  void stand_for(const YAML::Node& made, YAML::Node original) {
    stand_ins_.emplace_back(made, std::move(original));
  }

  std::string at(const YAML::Node& node) const {
    if (const std::string* text = override_of(node)) return "override '" + *text + "'";
    for (const auto& [made, original] : stand_ins_) {
      if (made.is(node)) return at(original);
    }
    if (node.Mark().is_null()) return origin_;
    return origin_ + ":" + std::to_string(node.Mark().line + 1);
  }

  [[noreturn]] void fail(const YAML::Node& node, const std::string& message) const {
    throw Error(at(node) + ": " + message);
  }

  // For a problem with a map key: the override that set its value, else the key's own line.
  [[noreturn]] void fail_key(const YAML::const_iterator& it, const std::string& message) const {
    fail(override_of(it->second) ? it->second : it->first, message);
  }

 private:
  std::string origin_;
  std::vector<std::pair<YAML::Node, std::string>> overrides_;
  std::vector<std::pair<YAML::Node, YAML::Node>> stand_ins_;
};

/// Rejects keys of `map` that are not in `allowed`, naming the key's own line.
void check_keys(const YAML::Node& map,
                const std::vector<std::string>& allowed,
                const std::string& context,
                const Locator& loc);

/// Whether `node` is a scalar that reads as a T; if so, `out` holds it.
template <class T>
bool scalar_as(const YAML::Node& node, T& out) {
  if (!node.IsScalar()) return false;
  try {
    out = node.as<T>();
    return true;
  } catch (const YAML::Exception&) {
    return false;
  }
}

/// What a message says `node` was: "'abc'", "a list", "a map" or "nothing".
std::string scalar_text(const YAML::Node& node);
/// A whole number >= 1, or a failure naming `what` and the node's line.
std::int64_t positive_int(const YAML::Node& node, const std::string& what, const Locator& loc);
/// Reads `concurrency`: serial, unlimited, or N >= 1.
std::size_t parse_concurrency(const YAML::Node& node, const std::string& ctx, const Locator& loc);
/// Reads one declared value; `where` starts messages about it ("stage 'x' (spin): param 'n' ").
/// The value is then checked as a stage's options from C++ are (value_problem). A relative path
/// is taken from `base_dir`, one an override gave from the shell's folder.
ParamValue parse_param(const ParamSpec& spec,
                       const YAML::Node& node,
                       const std::string& where,
                       const std::filesystem::path& base_dir,
                       const Locator& loc);

}  // namespace flowtrain::detail
