#include "graph/config/text.hpp"

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <sstream>

#include "graph/read_file.hpp"

namespace flowtrain::detail {

namespace {

// Finds the entry of a list of named maps (`stages`, `phases`) that an override's
// `<list>.<name>` picks: by its 'name', else (stages) by its 'type'.
YAML::Node find_named(YAML::Node list,
                      const std::string& list_key,
                      const std::string& name,
                      const std::string& text) {
  if (!list.IsSequence()) {
    throw Error("override '" + text + "': the config has no '" + list_key + "' list here");
  }
  std::string known;
  for (YAML::Node entry : list) {
    if (!entry.IsMap()) continue;
    const YAML::Node key = entry["name"] ? entry["name"] : entry["type"];
    const std::string entry_name = key && key.IsScalar() ? key.Scalar() : "";
    if (entry_name == name) return entry;
    known += (known.empty() ? "" : ", ") + entry_name;
  }
  const std::string kind = list_key.substr(0, list_key.size() - 1);  // "stages" -> "stage"
  throw Error("override '" + text + "': no " + kind + " named '" + name + "' (" + list_key + ": " +
              known + ")");
}

// The most values a config may hold with its YAML aliases expanded. Every walk over the config
// visits an aliased value again at each alias: nine levels of ten aliases each (a "billion
// laughs", under 1 KB) would be 10^9 visits per walk. A pipeline config has hundreds.
constexpr std::size_t kMaxExpandedValues = 100000;

// A walk over a config's nodes, as the aliases expand it.
struct StructureWalk {
  const std::string& origin;
  std::vector<YAML::Node> ancestors;  // of the node visited, the root first
  std::size_t values = 0;             // visited so far
};

// The line on which `node`'s expansion passed kMaxExpandedValues: that of the outermost node on
// its path that holds an alias (an alias refers back to its anchor, so the node it stands for
// begins before the node that holds it), else `node`'s.
int expansion_line(const YAML::Node& node, const StructureWalk& walk) {
  std::vector<YAML::Node> path = walk.ancestors;
  path.push_back(node);
  for (std::size_t i = 1; i < path.size(); ++i) {
    if (path[i].Mark().pos < path[i - 1].Mark().pos) return path[i - 1].Mark().line + 1;
  }
  return node.Mark().line + 1;
}

// Throws if a YAML alias makes `node` contain itself (`&a {threads: *a}`: every walk over the
// config would then recurse without end), if the aliases expand it past kMaxExpandedValues, or
// if a map repeats a key (YAML forbids it, yaml-cpp keeps both and a lookup sees only the
// first: a value given twice must not be half-ignored).
void reject_bad_structure(const YAML::Node& node, StructureWalk& walk) {
  if (++walk.values > kMaxExpandedValues) {
    throw Error(walk.origin + ":" + std::to_string(expansion_line(node, walk)) +
                ": the config holds more than " + std::to_string(kMaxExpandedValues) +
                " values once its YAML aliases are expanded (aliases of aliases multiply); use "
                "fewer aliases");
  }
  if (!node.IsMap() && !node.IsSequence()) return;
  for (const YAML::Node& ancestor : walk.ancestors) {
    if (ancestor.is(node)) {
      throw Error(walk.origin + ":" + std::to_string(node.Mark().line + 1) +
                  ": a YAML alias refers to a node that contains it (an endless cycle)");
    }
  }
  std::map<std::string, int> keys;  // key -> line it was first given on
  walk.ancestors.push_back(node);
  for (auto it = node.begin(); it != node.end(); ++it) {
    if (node.IsMap() && it->first.IsScalar()) {
      const int line = it->first.Mark().line + 1;
      const auto [first, fresh] = keys.emplace(it->first.Scalar(), line);
      if (!fresh) {
        throw Error(walk.origin + ":" + std::to_string(line) + ": duplicate key '" +
                    it->first.Scalar() + "' (first given on line " + std::to_string(first->second) +
                    "); give each key once");
      }
    }
    reject_bad_structure(node.IsMap() ? it->second : *it, walk);
  }
  walk.ancestors.pop_back();
}

void reject_bad_structure(const YAML::Node& node, const std::string& origin) {
  StructureWalk walk{origin, {}, 0};
  reject_bad_structure(node, walk);
}

void apply_override(YAML::Node& root, const std::string& text, Locator& loc) {
  const auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0) {
    throw Error("override '" + text +
                "': expected key.path=value, e.g. stages.decode.concurrency=2");
  }
  std::vector<std::string> keys;
  std::stringstream path(text.substr(0, eq));
  for (std::string key; std::getline(path, key, '.');) {
    if (key.empty()) throw Error("override '" + text + "': empty key in the path");
    keys.push_back(key);
  }
  YAML::Node value;
  try {
    value.reset(YAML::Load(text.substr(eq + 1)));
  } catch (const YAML::Exception& e) {
    throw Error("override '" + text + "': value is not valid YAML: " + e.msg);
  }
  if (!value.IsDefined() || value.IsNull()) value.reset(YAML::Node(std::string()));
  reject_bad_structure(value, "override '" + text + "'");

  // yaml-cpp's Node::operator= assigns content; reset() rebinds the handle.
  YAML::Node node = root;
  for (std::size_t i = 0; i + 1 < keys.size(); ++i) {
    // A phase that extends another names its changed stages as the keys of a map
    // (`stages: {student: {...}}`), which the generic steps below walk and extend.
    const bool composed =
        keys[i] == "stages" && node.IsMap() && static_cast<const YAML::Node&>(node)["extends"];
    if ((keys[i] == "stages" || keys[i] == "phases") && i + 2 < keys.size() && !composed) {
      node.reset(find_named(node[keys[i]], keys[i], keys[i + 1], text));
      ++i;
      continue;
    }
    YAML::Node child = node[keys[i]];
    if (!child.IsDefined() || child.IsNull()) {
      node[keys[i]] = YAML::Node(YAML::NodeType::Map);
      child.reset(node[keys[i]]);
      loc.add_override(child, text);  // it has no line: a problem with it names the override
    }
    if (!child.IsMap()) {
      throw Error("override '" + text + "': '" + keys[i] + "' is not a map of keys");
    }
    node.reset(child);
  }
  node[keys.back()] = value;
  loc.add_override(node[keys.back()], text);
}

// Puts back into `resolved` (a copy of the config after everything) each string that
// `references` (the same config before its `${key}` references were replaced) wrote with one.
void keep_references(YAML::Node resolved, const YAML::Node& references) {
  if (resolved.IsMap() && references.IsMap()) {
    for (auto it = resolved.begin(); it != resolved.end(); ++it) {
      const YAML::Node reference = references[it->first.Scalar()];
      if (reference) keep_references(it->second, reference);
    }
  } else if (resolved.IsSequence() && references.IsSequence()) {
    for (std::size_t i = 0; i < resolved.size() && i < references.size(); ++i) {
      keep_references(resolved[i], references[i]);
    }
  } else if (resolved.IsScalar() && references.IsScalar() &&
             references.Scalar().find("${") != std::string::npos) {
    resolved = references.Scalar();
  }
}


// The scalar at a dotted key path of `root` ("data.folder"), if there is one.
std::optional<YAML::Node> scalar_at(const YAML::Node& root, const std::string& path) {
  YAML::Node node = root;
  std::size_t begin = 0;
  while (node.IsMap()) {
    const std::size_t dot = path.find('.', begin);
    const YAML::Node child = static_cast<const YAML::Node&>(node)[path.substr(begin, dot - begin)];
    if (!child) return std::nullopt;
    node.reset(child);
    if (dot == std::string::npos) {
      return node.IsScalar() ? std::optional<YAML::Node>(node) : std::nullopt;
    }
    begin = dot + 1;
  }
  return std::nullopt;
}

// Replaces every `${key.path}` in the config's strings by the value of that key (a scalar of
// the config, after the overrides), as OmegaConf does: `manifest: ${data.folder}/train.csv`.
// A value taken from an override keeps that origin, so a relative path given on the command
// line stays relative to the shell's folder.
void interpolate(YAML::Node node, const YAML::Node& root, Locator& loc) {
  if (node.IsMap()) {
    for (auto it = node.begin(); it != node.end(); ++it) interpolate(it->second, root, loc);
  } else if (node.IsSequence()) {
    for (YAML::Node child : node) interpolate(child, root, loc);
  } else if (node.IsScalar() && node.Scalar().find("${") != std::string::npos) {
    std::string text = node.Scalar();
    const std::string* from_override = nullptr;
    for (std::size_t at = text.find("${"); at != std::string::npos; at = text.find("${", at)) {
      const std::size_t end = text.find('}', at);
      if (end == std::string::npos) loc.fail(node, "unclosed '${' in '" + node.Scalar() + "'");
      const std::string key = text.substr(at + 2, end - at - 2);
      const std::optional<YAML::Node> found = scalar_at(root, key);
      if (!found) loc.fail(node, "'${" + key + "}' names no key with a value in the config");
      const YAML::Node& value = *found;
      if (value.Scalar().find("${") != std::string::npos) {
        loc.fail(node, "'${" + key + "}' refers to a value that itself uses '${...}'");
      }
      if (const std::string* o = loc.override_of(value)) from_override = o;
      text.replace(at, end - at + 1, value.Scalar());
      at += value.Scalar().size();
    }
    node = text;
    if (from_override) loc.add_override(node, *from_override);
  }
}

// Replaces `${cwd}` in every string by the folder the command was started in, before the key
// references, so a key may use it and be referred to (`dir: ${cwd}/runs`, then `${output.dir}`).
void substitute_cwd(YAML::Node node) {
  if (node.IsMap()) {
    for (auto it = node.begin(); it != node.end(); ++it) substitute_cwd(it->second);
  } else if (node.IsSequence()) {
    for (YAML::Node child : node) substitute_cwd(child);
  } else if (node.IsScalar() && node.Scalar().find("${cwd}") != std::string::npos) {
    std::string text = node.Scalar();
    const std::string cwd = std::filesystem::current_path().string();
    for (std::size_t at = text.find("${cwd}"); at != std::string::npos; at = text.find("${cwd}", at)) {
      text.replace(at, 6, cwd);
      at += cwd.size();
    }
    node = text;
  }
}

}  // namespace

void write_resolved_paths(const YAML::Node& root,
                          const RunConfig& config,
                          const Registry& registry,
                          const std::vector<ConfigSection>& sections) {
  auto absolute = [](const std::string& path) {
    std::error_code ec;
    const std::filesystem::path p = std::filesystem::absolute(path, ec);
    return ec ? path : p.lexically_normal().string();
  };
  auto rewrite = [&](YAML::Node map, const std::vector<ParamSpec>& specs, const Params& values) {
    if (!map.IsMap()) return;
    for (auto it = map.begin(); it != map.end(); ++it) {
      const std::string key = it->first.as<std::string>();
      for (const ParamSpec& spec : specs) {
        if (spec.name != key) continue;
        if (spec.type != ParamType::kPath && spec.type != ParamType::kOutputPath) break;
        const std::string value = values.get_string(key);
        const bool chosen =
            std::find(spec.choices.begin(), spec.choices.end(), value) != spec.choices.end();
        if (!value.empty() && !chosen) it->second = absolute(value);
      }
    }
  };
  // Lookups through const nodes, which never add keys; the values are rewritten in place.
  const bool single = static_cast<bool>(root["stages"]);
  for (std::size_t i = 0; i < config.phases.size(); ++i) {
    const YAML::Node stages = single ? root["stages"] : root["phases"][i]["stages"];
    const std::vector<StageConfig>& validated = config.phases[i].stages;
    if (!stages) continue;  // a phase that extends another and changes no stage
    if (stages.IsMap()) {
      // A phase that extends another: the params it gives, by stage name (the base's own are
      // rewritten with the base).
      for (auto it = stages.begin(); it != stages.end(); ++it) {
        const YAML::Node params = it->second.IsMap() ? it->second["params"] : YAML::Node();
        for (const StageConfig& stage : validated) {
          const StageInfo* info = registry.find(stage.type);
          if (stage.name == it->first.Scalar() && params && info) {
            rewrite(params, info->doc.params, stage.params);
          }
        }
      }
      continue;
    }
    for (std::size_t j = 0; j < validated.size() && j < stages.size(); ++j) {
      const YAML::Node params = stages[j]["params"];
      const StageInfo* info = registry.find(validated[j].type);
      if (params && info) rewrite(params, info->doc.params, validated[j].params);
    }
  }
  for (const ConfigSection& section : sections) {
    if (const YAML::Node map = root[section.key]) {
      rewrite(map, section.params, config.sections.at(section.key));
    }
  }
}

std::string effective_text(const YAML::Node& root,
                           const YAML::Node& references,
                           const std::string& origin,
                           const std::vector<std::string>& overrides) {
  std::string out = "# effective config of " + origin;
  if (overrides.empty()) out += " (no overrides)";
  for (std::size_t i = 0; i < overrides.size(); ++i) {
    out += (i == 0 ? " with overrides: " : ", ") + overrides[i];
  }
  YAML::Node emitted = YAML::Clone(root);
  keep_references(emitted, references);
  YAML::Emitter emitter;
  emitter << emitted;
  return out + "\n" + emitter.c_str() + "\n";
}

YAML::Node load_root(const std::string& text,
                     const std::string& origin,
                     const std::vector<std::string>& overrides,
                     Locator& loc,
                     YAML::Node* references) {
  // yaml-cpp reads on past a NUL byte and keeps a different character in its place.
  if (const std::size_t nul = text.find('\0'); nul != std::string::npos) {
    const auto line = std::count(text.data(), text.data() + nul, '\n');
    throw Error(origin + ":" + std::to_string(line + 1) +
                ": a NUL byte in the config; YAML text cannot hold one");
  }
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    throw Error(origin + ":" + std::to_string(e.mark.line + 1) + ": YAML syntax error: " + e.msg);
  }
  if (!root.IsDefined() || root.IsNull()) throw Error(origin + ": the config is empty");
  reject_bad_structure(root, origin);
  for (const std::string& text_override : overrides) {
    if (!root.IsMap()) break;  // validate() reports it
    apply_override(root, text_override, loc);
  }
  substitute_cwd(root);
  if (references) *references = YAML::Clone(root);
  interpolate(root, root, loc);
  return root;
}

// The largest config file read: `flowtrain check /dev/zero` read until memory ran out.
constexpr std::size_t kMaxConfigBytes = 4 << 20;

std::string read_config_file(const std::string& path) {
  return read_text_file(path, "config", kMaxConfigBytes);
}

}  // namespace flowtrain::detail
