#pragma once

// The grammar of the names in a graph: a config names an input as a stage ("decode") or one
// output of a router ("route.big"), and an entry that brings nodes of its own
// (StageInfo::expand) names them "entry/node" ("student/grad_sync").

#include <string>
#include <string_view>

namespace flowtrain {

/// An input as a config names it, split at its last dot: `route.big` is router `route`'s output
/// `big`; `decode` is stage `decode` (no output). A stage whose own name holds a dot is named
/// whole: look the whole name up before its parts.
struct InputRef {
  std::string stage;
  std::string output;  // empty: the stage's one output

  static InputRef parse(std::string_view text) {
    const std::size_t dot = text.rfind('.');
    if (dot == std::string_view::npos) return {std::string(text), {}};
    return {std::string(text.substr(0, dot)), std::string(text.substr(dot + 1))};
  }
};

/// The name of node `node` that entry `entry` brings: "student/grad_sync".
inline std::string node_name(std::string_view entry, std::string_view node) {
  return std::string(entry) + "/" + std::string(node);
}

/// The entry a node belongs to: "student" for "student/grad_sync", an entry's own node's name
/// for itself.
inline std::string_view entry_of(std::string_view node) {
  return node.substr(0, node.find('/'));
}

}  // namespace flowtrain
