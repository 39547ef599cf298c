#include "graph/config.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>

#include "graph/error.hpp"
#include "graph/plugin.hpp"
#include "graph/read_file.hpp"

namespace flowtrain {

namespace {

const std::vector<std::string> kTopKeys = {"threads", "cores",  "metrics", "autotune",
                                           "stages",  "phases", "plugins"};
const std::vector<std::string> kPhaseKeys = {"name",     "threads", "cores",   "metrics",
                                             "autotune", "stages",  "extends", "without"};
const std::vector<std::string> kAutotuneKeys = {"enabled",  "warmup_s", "trial_s",
                                                "max_trials", "min_gain", "memory_mb"};
const std::vector<std::string> kMetricsKeys = {"sample_ms", "trace", "drops", "tensorboard"};
const std::vector<std::string> kStageKeys = {"type",           "name",    "params", "concurrency",
                                             "queue_capacity", "ordered", "inputs",
                                             "token_from"};

std::string entry_output(const PipelineConfig& config,
                         const Registry& registry,
                         const std::string& name);

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

// " (one of: a, b)", or for a path " (one of: a, b, or a file)".
std::string choices_text(const ParamSpec& p) {
  return " (one of: " + join(p.choices) + (p.type == ParamType::kPath ? ", or a file" : "") + ")";
}

// " (did you mean 'quality'?)" when a candidate is close, else a list of what is allowed.
std::string suggestion(const std::string& given, const std::vector<std::string>& candidates) {
  const std::string* best = nullptr;
  std::size_t best_distance = 0;
  for (const std::string& c : candidates) {
    const std::size_t d = edit_distance(given, c);
    if (!best || d < best_distance) {
      best = &c;
      best_distance = d;
    }
  }
  if (best && best_distance <= std::max<std::size_t>(2, given.size() / 3)) {
    return " (did you mean '" + *best + "'?)";
  }
  return candidates.empty() ? "" : " (known: " + join(candidates) + ")";
}

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

// Rejects keys of `map` that are not in `allowed`, naming the key's own line.
void check_keys(const YAML::Node& map,
                const std::vector<std::string>& allowed,
                const std::string& context,
                const Locator& loc) {
  for (auto it = map.begin(); it != map.end(); ++it) {
    const std::string key = it->first.as<std::string>();
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
      loc.fail_key(it, context + "unknown key '" + key + "'" + suggestion(key, allowed));
    }
  }
}

std::string stage_label(const std::string& name, const std::string& type) {
  return "stage '" + name + "' (" + type + "): ";
}

// "phase 'distill': " for a phase of a multi-phase config, "" for a single pipeline.
std::string phase_label(const std::string& name) {
  return name.empty() ? "" : "phase '" + name + "': ";
}

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

std::string scalar_text(const YAML::Node& node) {
  if (node.IsScalar()) return "'" + node.Scalar() + "'";
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a map";
  return "nothing";
}

std::int64_t positive_int(const YAML::Node& node, const std::string& what, const Locator& loc) {
  std::int64_t v = 0;
  if (!scalar_as(node, v) || v < 1) {
    loc.fail(node, what + " must be a whole number >= 1, got " + scalar_text(node));
  }
  return v;
}

// Reads `concurrency`: serial, unlimited, or N >= 1.
std::size_t parse_concurrency(const YAML::Node& node, const std::string& ctx, const Locator& loc) {
  if (node.IsScalar() && node.Scalar() == "serial") return kSerial;
  if (node.IsScalar() && node.Scalar() == "unlimited") return kUnlimited;
  std::int64_t v = 0;
  if (!scalar_as(node, v) || v < 1) {
    loc.fail(node, ctx + "concurrency must be 'serial', 'unlimited' or a whole number >= 1, got " +
                       scalar_text(node));
  }
  return static_cast<std::size_t>(v);
}

// Reads one declared value; `where` starts messages about it ("stage 'x' (spin): param 'n' ").
// The value is then checked as a stage's options from C++ are (value_problem).
ParamValue parse_param(const ParamSpec& spec,
                       const YAML::Node& node,
                       const std::string& where,
                       const std::filesystem::path& base_dir,
                       const Locator& loc) {
  auto wrong = [&]() {
    loc.fail(node, where + "must be " + (spec.type == ParamType::kInt ? "an " : "a ") +
                       to_string(spec.type) + ", got " + scalar_text(node));
  };
  auto read = [&]() -> ParamValue {
    switch (spec.type) {
      case ParamType::kInt: {
        std::int64_t v = 0;
        if (!scalar_as(node, v)) wrong();
        return v;
      }
      case ParamType::kFloat: {
        double v = 0;
        if (!scalar_as(node, v)) wrong();
        return v;
      }
      case ParamType::kBool: {
        bool v = false;
        if (!scalar_as(node, v)) wrong();
        return v;
      }
      case ParamType::kString:
        if (!node.IsScalar()) wrong();
        return node.Scalar();
      case ParamType::kPath:
      case ParamType::kOutputPath: {
        if (!node.IsScalar()) wrong();
        std::filesystem::path p = node.Scalar();
        if (p.empty() || std::find(spec.choices.begin(), spec.choices.end(), p.string()) !=
                             spec.choices.end()) {
          return p.string();  // a choice (a preset's name), not a file
        }
        // Relative to the config file's folder; a path given on the command line, to the shell's.
        if (p.is_relative() && !base_dir.empty() && !loc.is_override(node)) p = base_dir / p;
        return p.lexically_normal().string();
      }
      case ParamType::kFloatList:
      case ParamType::kIntList: {
        if (!node.IsSequence()) wrong();
        std::vector<double> out;
        for (const YAML::Node& item : node) {
          double v = 0;
          if (!scalar_as(item, v)) wrong();
          out.push_back(v);
        }
        return out;
      }
    }
    throw Error(where + "has an unknown type");
  };
  ParamValue value = read();
  if (std::string problem = value_problem(spec, value); !problem.empty()) {
    loc.fail(node, where + problem);
  }
  return value;
}

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

// Reads `autotune`: true/false, or a map of AutotuneOptions (`enabled` defaults to true there).
void read_autotune(const YAML::Node& node, const std::string& ctx, const Locator& loc,
                   AutotuneOptions& out) {
  if (node.IsScalar()) {
    if (!scalar_as(node, out.enabled)) {
      loc.fail(node, ctx + "autotune must be true, false or a map of its settings, got " +
                         scalar_text(node));
    }
    return;
  }
  if (!node.IsMap()) loc.fail(node, ctx + "autotune must be true, false or a map of its settings");
  check_keys(node, kAutotuneKeys, ctx + "autotune: ", loc);
  out.enabled = true;
  if (const YAML::Node enabled = node["enabled"]; enabled && !scalar_as(enabled, out.enabled)) {
    loc.fail(enabled, ctx + "autotune.enabled must be true or false, got " + scalar_text(enabled));
  }
  const auto number_in = [&](const char* key, double& value, double low, double high) {
    const YAML::Node n = node[key];
    if (n && (!scalar_as(n, value) || value < low || value > high)) {
      char range[64];
      std::snprintf(range, sizeof range, " must be a number in [%g, %g], got ", low, high);
      loc.fail(n, ctx + "autotune." + key + range + scalar_text(n));
    }
  };
  number_in("warmup_s", out.warmup_s, 0, 600);
  number_in("trial_s", out.trial_s, 0.1, 600);
  number_in("min_gain", out.min_gain, 0, 1);
  number_in("memory_mb", out.memory_mb, 0, 1e7);
  if (const YAML::Node n = node["max_trials"]) {
    const std::int64_t trials = positive_int(n, ctx + "autotune.max_trials", loc);
    if (trials > 1000) loc.fail(n, ctx + "autotune.max_trials must be at most 1000");
    out.max_trials = static_cast<std::size_t>(trials);
  }
}

// Sets `run` from a map's `threads`, `cores`, `metrics` and `autotune` keys; keys it lacks keep
// their value.
void read_run_options(const YAML::Node& map,
                      const std::string& ctx,
                      const Locator& loc,
                      RunOptions& run) {
  if (const YAML::Node threads = map["threads"]) {
    run.threads = static_cast<std::size_t>(positive_int(threads, ctx + "threads", loc));
  }
  if (const YAML::Node cores = map["cores"]) {
    run.cores = static_cast<std::size_t>(positive_int(cores, ctx + "cores", loc));
  }
  if (const YAML::Node autotune = map["autotune"]) read_autotune(autotune, ctx, loc, run.autotune);
  if (const YAML::Node metrics = map["metrics"]) {
    if (!metrics.IsMap()) loc.fail(metrics, ctx + "metrics must be a map");
    check_keys(metrics, kMetricsKeys, ctx + "metrics: ", loc);
    if (const YAML::Node ms = metrics["sample_ms"]) {
      if (!scalar_as(ms, run.sample_interval_ms) || run.sample_interval_ms <= 0) {
        loc.fail(ms, ctx + "metrics.sample_ms must be a number > 0, got " + scalar_text(ms));
      }
    }
    if (const YAML::Node trace = metrics["trace"]) {
      if (!trace.IsScalar()) loc.fail(trace, ctx + "metrics.trace must be a file path");
      run.trace_path = trace.Scalar();
    }
    if (const YAML::Node drops = metrics["drops"]) {
      if (!drops.IsScalar()) loc.fail(drops, ctx + "metrics.drops must be a file path");
      run.drops_path = drops.Scalar();
    }
    if (const YAML::Node tensorboard = metrics["tensorboard"]) {
      if (!tensorboard.IsScalar()) {
        loc.fail(tensorboard, ctx + "metrics.tensorboard must be a folder path");
      }
      run.tensorboard_dir = tensorboard.Scalar();
    }
  }
}

// A stage's `inputs`: one name or a list of names, each a stage listed before it.
std::vector<std::string> input_list(const YAML::Node& node,
                                    const std::string& ctx,
                                    const std::vector<StageConfig>& earlier,
                                    const Locator& loc) {
  std::vector<std::string> names;
  if (node.IsScalar()) {
    names.push_back(node.Scalar());
  } else if (node.IsSequence() && node.size() > 0) {
    for (const YAML::Node& n : node) {
      if (!n.IsScalar()) loc.fail(n, ctx + "inputs must be stage names, got " + scalar_text(n));
      names.push_back(n.Scalar());
    }
  } else {
    loc.fail(node, ctx + "inputs must be a stage name or a list of them, got " + scalar_text(node));
  }
  std::vector<std::string> known;
  for (const StageConfig& s : earlier) known.push_back(s.name);
  auto listed = [&](const std::string& name) {
    return std::find(known.begin(), known.end(), name) != known.end();
  };
  for (const std::string& name : names) {
    // "router.output": add_problem checks the output.
    const std::size_t dot = name.rfind('.');
    if (!listed(name) && (dot == std::string::npos || !listed(name.substr(0, dot)))) {
      loc.fail(node, ctx + "input '" + name + "' is not a stage listed before this one" +
                         suggestion(name, known));
    }
  }
  return names;
}

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

  PhaseComposer(const YAML::Node& phases, Locator& loc, const Registry& registry)
      : phases_(phases),
        loc_(loc),
        registry_(registry),
        done_(phases.size()),
        chain_(phases.size(), 1) {}

  // Phase `i` as validate_pipeline reads it: its own entry, or the phase composed from its base.
  YAML::Node phase(std::size_t i) {
    const YAML::Node entry = phases_[i];
    if (!entry.IsMap() || !entry["extends"]) return entry;
    if (!done_[i]) done_[i] = compose(i);
    return *done_[i];
  }

 private:
  // A stage of the base, as the composition sees it.
  struct BaseStage {
    std::string name;
    YAML::Node entry;
    std::vector<std::string> inputs;  // named, or the stage listed before it (none for a source)
  };

  static std::string name_of(const YAML::Node& phase) {
    const YAML::Node name = phase.IsMap() ? phase["name"] : YAML::Node();
    return name && name.IsScalar() ? name.Scalar() : "";
  }

  // A map of `from`'s entries but those keyed in `skip`: the same key and value nodes.
  static YAML::Node copy_map(const YAML::Node& from, const std::vector<std::string>& skip) {
    YAML::Node out(YAML::NodeType::Map);
    for (auto it = from.begin(); it != from.end(); ++it) {
      const std::string key = it->first.IsScalar() ? it->first.Scalar() : "";
      if (std::find(skip.begin(), skip.end(), key) == skip.end()) {
        out.force_insert(it->first, it->second);
      }
    }
    return out;
  }

  // A whole stage given under `stages`, with its key as its name.
  static YAML::Node named_copy(const YAML::Node& stage, const std::string& name) {
    YAML::Node out = copy_map(stage, {"name"});
    out["name"] = name;
    return out;
  }

  static std::vector<std::string> keys_of(const YAML::Node& map) {
    std::vector<std::string> keys;
    for (auto it = map.begin(); it != map.end(); ++it) {
      if (it->first.IsScalar()) keys.push_back(it->first.Scalar());
    }
    return keys;
  }

  // The names an `inputs` value lists (validate_pipeline refuses any other shape).
  static std::vector<std::string> input_names(const YAML::Node& inputs) {
    std::vector<std::string> names;
    if (inputs.IsScalar()) names.push_back(inputs.Scalar());
    if (inputs.IsSequence()) {
      for (const YAML::Node& n : inputs) {
        if (n.IsScalar()) names.push_back(n.Scalar());
      }
    }
    return names;
  }

  bool is_source(const YAML::Node& entry) const {
    const YAML::Node type = entry["type"];
    const StageInfo* info = type && type.IsScalar() ? registry_.find(type.Scalar()) : nullptr;
    return info && info->shape.kind == StageShape::Kind::kSource;
  }

  // The stages of phase `j` (composed first if it extends another), each with its inputs.
  std::vector<BaseStage> base_stages(std::size_t j) {
    const YAML::Node base = phase(j);
    const std::string ctx = phase_label(name_of(base));
    const YAML::Node stages = base["stages"];
    if (!stages || !stages.IsSequence()) {
      loc_.fail(stages ? stages : base,
                ctx + "'stages' must be a list of at least a source and a sink");
    }
    std::vector<BaseStage> out;
    for (const YAML::Node& entry : stages) {
      const YAML::Node type = entry.IsMap() ? entry["type"] : YAML::Node();
      if (!type || !type.IsScalar()) {
        loc_.fail(entry, ctx + "each stage must be a map with at least a 'type'");
      }
      const YAML::Node name = entry["name"];
      BaseStage stage{name && name.IsScalar() ? name.Scalar() : type.Scalar(), entry, {}};
      if (const YAML::Node inputs = entry["inputs"]) {
        stage.inputs = input_names(inputs);
      } else if (!out.empty() && !is_source(entry)) {
        stage.inputs = {out.back().name};
      }
      out.push_back(std::move(stage));
    }
    return out;
  }

  // The index of the phase that phase `i` extends; refuses an unknown name and a cycle.
  std::size_t base_of(std::size_t i, const std::string& ctx) {
    const YAML::Node extends = phases_[i]["extends"];
    if (!extends.IsScalar() || extends.Scalar().empty()) {
      loc_.fail(extends, ctx + "extends must name another phase, got " + scalar_text(extends));
    }
    std::vector<std::string> names;
    std::optional<std::size_t> base;
    for (std::size_t j = 0; j < phases_.size(); ++j) {
      const std::string name = name_of(phases_[j]);
      if (name == extends.Scalar() && !base) base = j;
      if (j != i && !name.empty()) names.push_back(name);
    }
    if (!base) {
      loc_.fail(extends, ctx + "extends '" + extends.Scalar() +
                             "', which is no phase of this config" +
                             suggestion(extends.Scalar(), names));
    }
    const auto visiting = std::find(composing_.begin(), composing_.end(), *base);
    if (visiting != composing_.end()) {
      std::string chain;
      for (auto it = visiting; it != composing_.end(); ++it) {
        chain += name_of(phases_[*it]) + " -> ";
      }
      loc_.fail(extends, ctx + "extends '" + extends.Scalar() + "', which comes back to it (" +
                             chain + extends.Scalar() +
                             "): a phase cannot extend itself, directly or not");
    }
    return *base;
  }

  [[noreturn]] void refuse_long_chain(std::size_t i) const {
    const YAML::Node extends = phases_[i]["extends"];
    loc_.fail(extends, phase_label(name_of(phases_[i])) + "extends '" + extends.Scalar() +
                           "', which makes a chain of more than " + std::to_string(kMaxChain) +
                           " phases that extend one another");
  }

  YAML::Node compose(std::size_t i) {
    const YAML::Node entry = phases_[i];
    const std::string ctx = phase_label(name_of(entry));
    composing_.push_back(i);
    const std::size_t base_index = base_of(i, ctx);
    // Before recursing deeper: the first phase composing is on a chain longer than the bound.
    if (composing_.size() >= kMaxChain) refuse_long_chain(composing_.front());
    const std::string base_name = name_of(phases_[base_index]);
    const std::vector<BaseStage> base = base_stages(base_index);
    composing_.pop_back();
    chain_[i] = chain_[base_index] + 1;
    if (chain_[i] > kMaxChain) refuse_long_chain(i);
    std::vector<std::string> base_names;
    for (const BaseStage& stage : base) base_names.push_back(stage.name);
    const auto in_base = [&](const std::string& name) {
      return std::find(base_names.begin(), base_names.end(), name) != base_names.end();
    };

    const YAML::Node without = entry["without"];
    const std::vector<std::string> dropped = dropped_stages(without, base_names, base_name, ctx);
    const auto is_dropped = [&](const std::string& name) {
      return std::find(dropped.begin(), dropped.end(), name) != dropped.end();
    };

    const YAML::Node changes = entry["stages"];
    if (changes && !changes.IsNull() && !changes.IsMap()) {
      loc_.fail(changes, ctx +
                             "a phase that extends another gives 'stages' as a map of stage name "
                             "to what changes (student: {params: {lr: 0.01}}), not a list");
    }
    std::vector<std::string> change_keys = kStageKeys;
    change_keys.erase(std::find(change_keys.begin(), change_keys.end(), "name"));
    if (changes && changes.IsMap()) {
      for (auto it = changes.begin(); it != changes.end(); ++it) {
        const std::string name = it->first.as<std::string>();
        const std::string stage_ctx = ctx + "stage '" + name + "': ";
        if (!it->second.IsMap()) {
          loc_.fail_key(it, stage_ctx +
                                "must be a map of the keys that change (params, "
                                "concurrency, ...), or a whole stage with its 'type'");
        }
        if (it->second["name"]) {
          loc_.fail(it->second["name"], stage_ctx + "'name' is not needed: the key is its name");
        }
        check_keys(it->second, change_keys, stage_ctx, loc_);
        if (is_dropped(name)) {
          loc_.fail_key(it, stage_ctx + "'without' drops it, and 'stages' changes it: do one");
        }
        if (!it->second["type"] && !in_base(name)) {
          loc_.fail_key(it, stage_ctx + "phase '" + base_name + "' has no stage '" + name + "'" +
                                suggestion(name, base_names) + "; a stage to add gives its 'type'");
        }
      }
    }
    // The phase's changes to stage `name` (a map, checked above), or a null node.
    const auto change_of = [&](const std::string& name) -> YAML::Node {
      if (!changes || !changes.IsMap()) return YAML::Node();
      const YAML::Node change = changes[name];
      return change ? change : YAML::Node();
    };

    // What fed dropped stage `name`: the outputs of kept stages it took, through dropped ones.
    const auto feeds = [&](const std::string& name) {
      std::vector<std::string> out, seen, todo = {name};
      while (!todo.empty()) {
        const std::string dropped_name = todo.back();
        todo.pop_back();
        if (std::find(seen.begin(), seen.end(), dropped_name) != seen.end()) continue;
        seen.push_back(dropped_name);
        for (const BaseStage& stage : base) {
          if (stage.name != dropped_name) continue;
          for (const std::string& input : stage.inputs) {
            const std::string from = stage_of(input, base_names);
            if (is_dropped(from)) {
              todo.push_back(from);
            } else if (std::find(out.begin(), out.end(), input) == out.end()) {
              out.push_back(input);
            }
          }
        }
      }
      return out;
    };

    // The `inputs` this phase gives a stage are taken as they are: none may be dropped.
    const auto check_given_inputs = [&](const YAML::Node& stage_entry, const std::string& name) {
      const YAML::Node inputs = stage_entry["inputs"];
      if (!inputs) return;
      for (const std::string& input : input_names(inputs)) {
        if (is_dropped(stage_of(input, base_names))) {
          loc_.fail(inputs,
                    ctx + "stage '" + name + "' takes '" + input + "', which 'without' drops");
        }
      }
    };

    YAML::Node stages(YAML::NodeType::Sequence);
    loc_.stand_for(stages, entry);  // a problem of the composed graph is the phase's
    std::string previous;           // the last stage listed so far
    for (const BaseStage& stage : base) {
      if (is_dropped(stage.name)) continue;
      const YAML::Node change = change_of(stage.name);
      const bool changed = change.IsMap();
      const bool whole = changed && change["type"];
      YAML::Node out = whole     ? named_copy(change, stage.name)
                       : changed ? merged_stage(stage.entry, change)
                                 : stage.entry;
      const YAML::Node view = out;  // looked up without adding keys (stage.entry is the base's)
      const YAML::Node token = view["token_from"];
      if (token && token.IsScalar() && is_dropped(token.Scalar())) {
        loc_.fail(without, ctx + "stage '" + stage.name + "' has token_from '" + token.Scalar() +
                               "', which 'without' drops");
      }
      // Its inputs here: its own (a whole stage's, or changed ones), else the base stage's.
      std::vector<std::string> inputs = stage.inputs;
      if (whole || (changed && change["inputs"])) {
        check_given_inputs(view, stage.name);
        inputs = view["inputs"]                          ? input_names(view["inputs"])
                 : !previous.empty() && !is_source(view) ? std::vector{previous}
                                                         : std::vector<std::string>{};
      }
      std::vector<std::string> rewired;
      for (const std::string& input : inputs) {
        const std::string from = stage_of(input, base_names);
        if (!is_dropped(from)) {
          rewired.push_back(input);
          continue;
        }
        const std::vector<std::string> fed = feeds(from);
        if (fed.size() != 1) {
          loc_.fail(without, ctx + "stage '" + stage.name + "' takes '" + input +
                                 "', which 'without' drops, and " +
                                 (fed.empty() ? std::string("nothing fed that")
                                              : "that was fed by " + join(fed)) +
                                 ": give stage '" + stage.name + "' its 'inputs' under 'stages'");
        }
        rewired.push_back(fed.front());
      }
      // A stage that took the one listed before it still does when that is what fed the dropped
      // ones (baseline's student: distill's merge is gone, mixup is listed before it now).
      const bool takes_previous = !view["inputs"] && rewired == std::vector{previous};
      if (rewired != inputs && !takes_previous) {
        out = copy_map(out, {"inputs"});
        YAML::Node names(YAML::NodeType::Sequence);
        for (const std::string& name : rewired) names.push_back(name);
        out["inputs"] = names;
        loc_.stand_for(names, without);
      }
      if (!out.is(stage.entry)) loc_.stand_for(out, changed ? change : without);
      stages.push_back(out);
      previous = stage.name;
    }
    if (changes && changes.IsMap()) {
      for (auto it = changes.begin(); it != changes.end(); ++it) {
        const std::string name = it->first.as<std::string>();
        if (in_base(name)) continue;
        check_given_inputs(it->second, name);
        YAML::Node out = named_copy(it->second, name);
        loc_.stand_for(out, it->second);
        stages.push_back(out);
      }
    }
    YAML::Node composed = copy_map(entry, {"extends", "without", "stages"});
    composed["stages"] = stages;
    loc_.stand_for(composed, entry);
    return composed;
  }

  // The stage an input names: `router.output` is the router's.
  static std::string stage_of(const std::string& input, const std::vector<std::string>& names) {
    if (std::find(names.begin(), names.end(), input) != names.end()) return input;
    const std::size_t dot = input.rfind('.');
    return dot == std::string::npos ? input : input.substr(0, dot);
  }

  // `without`: a stage name or a list of them, each a stage of the base.
  std::vector<std::string> dropped_stages(const YAML::Node& without,
                                          const std::vector<std::string>& base_names,
                                          const std::string& base_name,
                                          const std::string& ctx) {
    std::vector<std::string> dropped;
    if (!without || without.IsNull()) return dropped;
    if (!without.IsScalar() && !without.IsSequence()) {
      loc_.fail(without, ctx + "without must be a stage name or a list of them, got " +
                             scalar_text(without));
    }
    // `without=[a, b]` on the command line: its items have the override's marks, not the file's.
    const bool overridden = loc_.is_override(without);
    const auto add = [&](const YAML::Node& item) {
      const YAML::Node& where = overridden ? without : item;
      if (!item.IsScalar()) {
        loc_.fail(where, ctx + "without must list stage names, got " + scalar_text(item));
      }
      if (std::find(base_names.begin(), base_names.end(), item.Scalar()) == base_names.end()) {
        loc_.fail(where, ctx + "without: phase '" + base_name + "' has no stage '" + item.Scalar() +
                             "'" + suggestion(item.Scalar(), base_names));
      }
      if (std::find(dropped.begin(), dropped.end(), item.Scalar()) != dropped.end()) {
        loc_.fail(where, ctx + "without names stage '" + item.Scalar() + "' twice");
      }
      dropped.push_back(item.Scalar());
    };
    if (without.IsScalar()) add(without);
    if (without.IsSequence()) {
      for (const YAML::Node& item : without) add(item);
    }
    return dropped;
  }

  // The base's stage entry with `change`'s keys over it; `params` merged key by key.
  YAML::Node merged_stage(const YAML::Node& entry, const YAML::Node& change) {
    YAML::Node out = copy_map(entry, keys_of(change));
    for (auto it = change.begin(); it != change.end(); ++it) {
      const YAML::Node params = entry["params"];
      if (it->first.Scalar() == "params" && params && params.IsMap() && it->second.IsMap()) {
        YAML::Node merged = copy_map(params, keys_of(it->second));
        for (auto p = it->second.begin(); p != it->second.end(); ++p)
          merged.force_insert(p->first, p->second);
        loc_.stand_for(merged, it->second);
        out.force_insert(it->first, merged);
      } else {
        out.force_insert(it->first, it->second);
      }
    }
    return out;
  }

  const YAML::Node phases_;
  Locator& loc_;
  const Registry& registry_;
  std::vector<std::optional<YAML::Node>> done_;
  std::vector<std::size_t> composing_;  // the phases being composed, innermost last
  std::vector<std::size_t> chain_;      // phases in each one's chain of `extends`, itself too
};

// Validates one pipeline: the `stages` of `map` and the run options it sets over `defaults`.
// `ctx` starts every message ("phase 'distill': " in a multi-phase config, else empty).
PipelineConfig validate_pipeline(const YAML::Node& map,
                                 const RunOptions& defaults,
                                 const std::string& ctx,
                                 const std::filesystem::path& base_dir,
                                 const Locator& loc,
                                 const Registry& registry) {
  PipelineConfig config;
  config.run = defaults;
  read_run_options(map, ctx, loc, config.run);

  const YAML::Node stages = map["stages"];
  if (!stages) loc.fail(map, ctx + "missing key 'stages' (the list of stages to run)");
  if (!stages.IsSequence() || stages.size() < 2) {
    loc.fail(stages, ctx + "'stages' must be a list of at least a source and a sink");
  }

  std::vector<std::string> type_names;
  for (const StageInfo* info : registry.all()) type_names.push_back(info->type);

  for (const YAML::Node& entry : stages) {
    if (!entry.IsMap()) loc.fail(entry, ctx + "each stage must be a map with at least a 'type'");
    const YAML::Node type_node = entry["type"];
    if (!type_node || !type_node.IsScalar()) loc.fail(entry, ctx + "stage without a 'type'");
    const std::string type = type_node.Scalar();
    const StageInfo* info = registry.find(type);
    if (!info) {
      loc.fail(type_node, ctx + "unknown stage type '" + type + "'" + suggestion(type, type_names) +
                              "; `flowtrain stages` lists them (a plugin's, once `plugins:` "
                              "or --plugin names its library)");
    }
    StageConfig stage;
    stage.type = type;
    stage.name = entry["name"] ? entry["name"].as<std::string>() : type;
    stage.location = loc.at(entry);
    const std::string stage_ctx = ctx + stage_label(stage.name, type);
    check_keys(entry, kStageKeys, stage_ctx, loc);
    for (const StageConfig& other : config.stages) {
      if (other.name == stage.name) {
        loc.fail(entry, stage_ctx + "a stage named '" + stage.name + "' already exists at " +
                            other.location + "; give one a different 'name'");
      }
    }
    if (const YAML::Node c = entry["concurrency"]) {
      stage.options.concurrency = parse_concurrency(c, stage_ctx, loc);
    }
    if (const YAML::Node q = entry["queue_capacity"]) {
      stage.options.queue_capacity =
          static_cast<std::size_t>(positive_int(q, stage_ctx + "queue_capacity", loc));
    }
    if (const YAML::Node o = entry["ordered"]) {
      if (!scalar_as(o, stage.options.ordered)) {
        loc.fail(o, stage_ctx + "ordered must be true or false, got " + scalar_text(o));
      }
    }

    stage.params = Params::defaults(info->doc.params);
    if (const YAML::Node params = entry["params"]) {
      if (!params.IsMap()) loc.fail(params, stage_ctx + "params must be a map of name: value");
      std::vector<std::string> declared;
      for (const ParamSpec& spec : info->doc.params) declared.push_back(spec.name);
      for (auto it = params.begin(); it != params.end(); ++it) {
        const std::string key = it->first.as<std::string>();
        const ParamSpec* spec = info->find_param(key);
        if (!spec) {
          loc.fail_key(it, stage_ctx + "unknown param '" + key + "'" + suggestion(key, declared));
        }
        if (key == info->doc.threads_param && it->second.IsScalar() &&
            it->second.Scalar() == "auto") {
          stage.auto_threads = true;  // the default until resolve_auto_threads
          continue;
        }
        stage.params.set(
            key, parse_param(*spec, it->second, stage_ctx + "param '" + key + "' ", base_dir, loc));
      }
    }

    if (info->check) {
      try {
        info->check(stage.params);
      } catch (const Error& e) {
        loc.fail(entry["params"] ? entry["params"] : entry, stage_ctx + e.what());
      }
    }

    if (const YAML::Node inputs = entry["inputs"]) {
      stage.options.inputs = input_list(inputs, stage_ctx, config.stages, loc);
    }
    if (const YAML::Node token = entry["token_from"]) {
      if (!token.IsScalar() || token.Scalar().empty()) {
        loc.fail(token, stage_ctx + "token_from must name a stage listed after this one");
      }
      stage.options.token_from = token.Scalar();
    }

    if (std::string problem = options_problem(info->shape, stage.options); !problem.empty()) {
      loc.fail(entry, stage_ctx + problem);
    }
    // Checked against the earlier entries with their nodes (the last one, not yet taken by this
    // one, is expanded there), so its default input is spelled out.
    StageOptions checked = stage.options;
    if (checked.inputs.empty() && !config.stages.empty() && info->shape.kind != StageShape::Kind::kSource) {
      checked.inputs = {config.stages.back().name};
    }
    for (std::string& input : checked.inputs) input = entry_output(config, registry, input);
    std::vector<InputLink> resolved;
    if (std::string problem = add_problem(stage_decls(config, registry),
                                          {stage.name, info->shape, checked}, resolved);
        !problem.empty()) {
      loc.fail(entry, ctx + problem);
    }
    config.stages.push_back(std::move(stage));
  }
  if (std::string problem = graph_problem(stage_decls(config, registry)); !problem.empty()) {
    loc.fail(stages, ctx + problem);
  }
  resolve_auto_threads(config, registry);
  return config;
}

// Validates an application's section: a map of its declared keys, each optional.
Params validate_section(const YAML::Node& root,
                        const ConfigSection& section,
                        const std::filesystem::path& base_dir,
                        const Locator& loc) {
  Params params = Params::defaults(section.params);
  const YAML::Node map = root[section.key];
  if (!map || map.IsNull()) return params;
  if (!map.IsMap()) loc.fail(map, section.key + " must be a map of key: value");
  std::vector<std::string> declared;
  for (const ParamSpec& spec : section.params) declared.push_back(spec.name);
  for (auto it = map.begin(); it != map.end(); ++it) {
    const std::string key = it->first.as<std::string>();
    const auto spec = std::find_if(section.params.begin(), section.params.end(),
                                   [&](const ParamSpec& p) { return p.name == key; });
    if (spec == section.params.end()) {
      loc.fail_key(it, section.key + ": unknown key '" + key + "'" + suggestion(key, declared));
    }
    params.set(key, parse_param(*spec, it->second, section.key + "." + key + " ", base_dir, loc));
  }
  return params;
}

// Writes every path param the config gives as the absolute form of its resolved value, so the
// effective text does not depend on the folder it is read from.
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

// The YAML of the config after overrides, headed by a comment saying where it came from. A
// value that refers to another key (`${output.dir}/teacher`) keeps the reference, so a run
// started from the saved text with `output.dir=OTHER` writes to OTHER, not to this run's folder.
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

// Reads config text, applies the overrides, then `${cwd}` and the `${...}` key references.
// `references`, if given, receives the config as it was before the key references.
YAML::Node load_root(const std::string& text,
                     const std::string& origin,
                     const std::vector<std::string>& overrides,
                     Locator& loc,
                     YAML::Node* references = nullptr) {
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

// Validates a whole config: one pipeline (`stages`) or several run in turn (`phases`), each
// phase inheriting the top-level run options. Every phase is checked before any runs.
RunConfig validate(const YAML::Node& root,
                   const std::string& origin,
                   const std::filesystem::path& base_dir,
                   Locator& loc,
                   const Registry& registry,
                   const std::vector<ConfigSection>& sections) {
  if (!root.IsMap()) loc.fail(root, "a config must be a map with a 'stages' or a 'phases' list");
  std::vector<std::string> top_keys = kTopKeys;
  for (const ConfigSection& section : sections) top_keys.push_back(section.key);
  check_keys(root, top_keys, "", loc);
  const YAML::Node stages = root["stages"];
  const YAML::Node phases = root["phases"];
  if (stages && phases) {
    auto key = root.begin();  // name the line of the 'phases' key
    while (key->first.Scalar() != "phases") ++key;
    loc.fail_key(key,
                 "a config has 'stages' (one pipeline) or 'phases' (pipelines run in turn), "
                 "not both");
  }
  if (!stages && !phases) {
    loc.fail(root,
             "missing key 'stages' (the list of stages to run) or 'phases' (a list of "
             "pipelines run in turn)");
  }

  RunConfig config;
  config.origin = origin;
  for (const ConfigSection& section : sections) {
    config.sections[section.key] = validate_section(root, section, base_dir, loc);
  }
  if (stages) {
    config.phases.push_back(validate_pipeline(root, {}, "", base_dir, loc, registry));
  } else {
    if (!phases.IsSequence() || phases.size() == 0) {
      loc.fail(phases, "'phases' must be a list of maps, each with a 'name' and 'stages'");
    }
    RunOptions defaults;
    read_run_options(root, "", loc, defaults);
    PhaseComposer composer(phases, loc, registry);
    for (std::size_t i = 0; i < phases.size(); ++i) {
      const YAML::Node entry = phases[i];
      if (!entry.IsMap()) loc.fail(entry, "each phase must be a map with a 'name' and 'stages'");
      const YAML::Node name = entry["name"];
      if (!name || !name.IsScalar() || name.Scalar().empty()) {
        loc.fail(entry, "phase without a 'name'");
      }
      const std::string ctx = phase_label(name.Scalar());
      check_keys(entry, kPhaseKeys, ctx, loc);
      for (std::size_t j = 0; j < i; ++j) {
        if (config.phases[j].name == name.Scalar()) {
          loc.fail(name, ctx + "a phase named '" + name.Scalar() + "' already exists at " +
                             loc.at(phases[j]) + "; give one a different 'name'");
        }
      }
      if (entry["without"] && !entry["extends"]) {
        loc.fail(entry["without"], ctx +
                                       "'without' drops stages of the phase named by 'extends', "
                                       "which this phase does not have");
      }
      config.phases.push_back(
          validate_pipeline(composer.phase(i), defaults, ctx, base_dir, loc, registry));
      config.phases.back().name = name.Scalar();
      config.phases.back().run.key_prefix = "phases." + name.Scalar() + ".";
    }
  }
  for (PipelineConfig& phase : config.phases) phase.origin = origin;
  return config;
}

// Loads the shared libraries of the top-level `plugins:` list (load_plugin), so that the stages
// are validated against the types they register, and writes each path absolute in the config
// (its effective text then reads the same from any folder). A path is relative to the config
// file's folder, as path params are; one given by an override, to the shell's.
void load_plugins(const YAML::Node& root,
                  const std::filesystem::path& base_dir,
                  const Locator& loc) {
  if (!root.IsMap()) return;  // validate() reports it
  const YAML::Node plugins = root["plugins"];
  if (!plugins) return;
  if (!plugins.IsSequence()) {
    loc.fail(plugins,
             "'plugins' must be a list of shared library paths, got " + scalar_text(plugins));
  }
  // `plugins=[a.so]` on the command line: its items have the override's marks, not the file's.
  const bool list_overridden = loc.is_override(plugins);
  for (YAML::Node item : plugins) {
    const YAML::Node& where = list_overridden ? plugins : item;
    if (!item.IsScalar() || item.Scalar().empty()) {
      loc.fail(where, "each entry of 'plugins' must be the path of a shared library, got " +
                          scalar_text(item));
    }
    std::filesystem::path path = item.Scalar();
    if (path.is_relative() && !base_dir.empty() && !list_overridden && !loc.is_override(item)) {
      path = base_dir / path;
    }
    path = path.lexically_normal();
    try {
      load_plugin(path.string());
    } catch (const Error& e) {
      loc.fail(where, e.what());
    }
    std::error_code ec;
    const std::filesystem::path absolute = std::filesystem::absolute(path, ec);
    if (!ec) item = absolute.lexically_normal().string();
  }
}

RunConfig parse(const std::string& text,
                const std::string& origin,
                const std::filesystem::path& base_dir,
                const std::vector<std::string>& overrides,
                const Registry& registry,
                const std::vector<ConfigSection>& sections) {
  for (const ConfigSection& section : sections) {
    if (std::find(kTopKeys.begin(), kTopKeys.end(), section.key) != kTopKeys.end()) {
      throw Error("config section '" + section.key + "' has the name of a built-in key");
    }
  }
  Locator loc(origin);
  YAML::Node references;
  const YAML::Node root = load_root(text, origin, overrides, loc, &references);
  try {
    load_plugins(root, base_dir, loc);
    RunConfig config = validate(root, origin, base_dir, loc, registry, sections);
    write_resolved_paths(root, config, registry, sections);
    config.effective_text = effective_text(root, references, origin, overrides);
    return config;
  } catch (const YAML::Exception& e) {
    throw Error(origin + ":" + std::to_string(e.mark.line + 1) + ": " + e.msg);
  }
}

// The one pipeline of a single-pipeline config.
PipelineConfig single_pipeline(RunConfig config) {
  if (config.phases.size() != 1 || !config.phases[0].name.empty()) {
    throw Error(config.origin +
                ": the config has 'phases'; read it with load_run_config or parse_run_config");
  }
  return std::move(config.phases[0]);
}

// A Markdown table of declared values (`column` names the first column), or `none`.
std::string params_markdown(const std::vector<ParamSpec>& specs,
                            const std::string& column,
                            const std::string& none) {
  if (specs.empty()) return none + "\n\n";
  std::string out = "| " + column + " | type | default | meaning |\n|---|---|---|---|\n";
  for (const ParamSpec& p : specs) {
    std::string doc = p.doc;
    if (!p.choices.empty()) doc += choices_text(p);
    if (p.max) {
      char most[32];
      std::snprintf(most, sizeof most, " (at most %.10g)", *p.max);  // 0.99, 4096
      doc += most;
    }
    out += "| `" + p.name + "` | " + to_string(p.type) + " | `" + p.default_text() + "` | " + doc +
           " |\n";
  }
  return out + "\n";
}

}  // namespace

RunConfig load_run_config(const std::string& path,
                          const std::vector<std::string>& overrides,
                          const Registry& registry) {
  return load_run_config(path, overrides, {}, registry);
}

RunConfig load_run_config(const std::string& path,
                          const std::vector<std::string>& overrides,
                          const std::vector<ConfigSection>& sections,
                          const Registry& registry) {
  // Relative paths inside a config are relative to the config file's folder.
  return parse(read_config_file(path), path, std::filesystem::path(path).parent_path(), overrides, registry,
               sections);
}

std::map<std::string, Params> load_config_sections(const std::string& path,
                                                   const std::vector<std::string>& overrides,
                                                   const std::vector<ConfigSection>& sections) {
  Locator loc(path);
  const YAML::Node root = load_root(read_config_file(path), path, overrides, loc);
  if (!root.IsMap()) loc.fail(root, "a config must be a map with a 'stages' or a 'phases' list");
  std::vector<std::string> top_keys = kTopKeys;
  for (const ConfigSection& section : sections) top_keys.push_back(section.key);
  std::map<std::string, Params> out;
  try {
    check_keys(root, top_keys, "", loc);
    for (const ConfigSection& section : sections) {
      out[section.key] =
          validate_section(root, section, std::filesystem::path(path).parent_path(), loc);
    }
  } catch (const YAML::Exception& e) {
    throw Error(path + ":" + std::to_string(e.mark.line + 1) + ": " + e.msg);
  }
  return out;
}

RunConfig parse_run_config(const std::string& text,
                           const std::string& origin,
                           const std::vector<std::string>& overrides,
                           const Registry& registry) {
  return parse(text, origin, {}, overrides, registry, {});
}

RunConfig parse_run_config(const std::string& text,
                           const std::string& origin,
                           const std::vector<std::string>& overrides,
                           const std::vector<ConfigSection>& sections,
                           const Registry& registry) {
  return parse(text, origin, {}, overrides, registry, sections);
}

PipelineConfig load_pipeline_config(const std::string& path,
                                    const std::vector<std::string>& overrides,
                                    const Registry& registry) {
  return single_pipeline(load_run_config(path, overrides, registry));
}

PipelineConfig parse_pipeline_config(const std::string& text,
                                     const std::string& origin,
                                     const std::vector<std::string>& overrides,
                                     const Registry& registry) {
  return single_pipeline(parse_run_config(text, origin, overrides, registry));
}

namespace {
const StageInfo& registered(const StageConfig& stage, const Registry& registry) {
  const StageInfo* info = registry.find(stage.type);
  if (!info) throw Error(stage.location + ": unknown stage type '" + stage.type + "'");
  return *info;
}

// The node that carries the output of the entry named `name` (the last of the nodes it always
// brings, StageInfo::expand), or `name` itself.
std::string entry_output(const PipelineConfig& config, const Registry& registry, const std::string& name) {
  for (const StageConfig& entry : config.stages) {
    if (entry.name != name) continue;
    const StageInfo& info = registered(entry, registry);
    std::string output = name;
    if (info.expand) {
      for (const ExpandedNode& node : info.expand(entry.params, config.run)) {
        if (node.always) output = name + "/" + node.node;
      }
    }
    return output;
  }
  return name;
}

// True if an entry after `i` takes its output: names it (or one of its outputs) as an input, or
// follows it with no inputs named.
bool consumed(const std::vector<StageConfig>& stages, std::size_t i, const Registry& registry) {
  const std::string& name = stages[i].name;
  for (std::size_t j = i + 1; j < stages.size(); ++j) {
    const std::vector<std::string>& inputs = stages[j].options.inputs;
    if (inputs.empty() && j == i + 1 &&
        registered(stages[j], registry).shape.kind != StageShape::Kind::kSource) {
      return true;
    }
    for (const std::string& input : inputs) {
      if (input == name || input.rfind(name + ".", 0) == 0) return true;
    }
  }
  return false;
}
}  // namespace

std::vector<StageConfig> expanded_stages(const PipelineConfig& config, const Registry& registry) {
  std::vector<StageConfig> out;
  for (std::size_t i = 0; i < config.stages.size(); ++i) {
    const StageConfig& entry = config.stages[i];
    out.push_back(entry);
    for (std::string& input : out.back().options.inputs) {
      input = entry_output(config, registry, input);
    }
    const StageInfo& info = registered(entry, registry);
    if (!info.expand) continue;
    const std::size_t entry_at = out.size() - 1;
    const bool consumed_by_entries = consumed(config.stages, i, registry);
    const std::string output = entry_output(config, registry, entry.name);
    for (ExpandedNode& node : info.expand(entry.params, config.run)) {
      if (!node.always && consumed_by_entries) continue;
      StageConfig expanded;
      expanded.type = std::move(node.type);
      expanded.name = entry.name + "/" + node.node;
      expanded.options.concurrency = node.concurrency;
      expanded.options.queue_capacity = node.queue_capacity;
      for (const std::string& input : node.inputs) {
        expanded.options.inputs.push_back(entry.name + "/" + input);
      }
      if (node.inputs.empty()) expanded.options.inputs = {node.always ? entry.name : output};
      if (node.sends_token_to_entry && out[entry_at].options.token_from.empty()) {
        out[entry_at].options.token_from = expanded.name;
      }
      expanded.params = std::move(node.params);
      expanded.location = entry.location;
      out.push_back(std::move(expanded));
    }
  }
  return out;
}

std::vector<StageDecl> stage_decls(const PipelineConfig& config, const Registry& registry) {
  std::vector<StageDecl> out;
  for (const StageConfig& stage : expanded_stages(config, registry)) {
    const StageInfo& info = registered(stage, registry);
    StageDecl decl{stage.name, info.shape, stage.options};
    if (!info.doc.threads_param.empty()) {
      decl.threads_param = info.doc.threads_param;
      decl.threads_per_invocation = static_cast<std::size_t>(stage.params.get_int(decl.threads_param));
    }
    out.push_back(std::move(decl));
  }
  return out;
}

void resolve_auto_threads(PipelineConfig& phase, const Registry& registry) {
  std::vector<std::pair<StageConfig*, std::string>> autos;  // stage, its threads param
  for (StageConfig& stage : phase.stages) {
    if (stage.auto_threads) autos.emplace_back(&stage, registered(stage, registry).doc.threads_param);
  }
  if (autos.empty()) return;
  for (std::size_t n = threads_and_cores(phase.run).second;; --n) {
    for (auto& [stage, param] : autos) stage->params.set(param, static_cast<std::int64_t>(n));
    if (n == 1 || thread_budget_problem(stage_decls(phase, registry), phase.run).empty()) return;
  }
}

void check_thread_budget(const PipelineConfig& phase, const Registry& registry) {
  // An entry whose nodes work on each item at the same time as it (pipeline partitions) needs
  // a graph thread for each, or they take turns.
  const std::size_t threads = threads_and_cores(phase.run).first;
  for (const StageConfig& entry : phase.stages) {
    const StageInfo& info = registered(entry, registry);
    if (!info.expand) continue;
    std::string together = "'" + entry.name + "'";
    std::size_t count = 1;
    for (const ExpandedNode& node : info.expand(entry.params, phase.run)) {
      if (!node.runs_with_entry) continue;
      together += ", '" + entry.name + "/" + node.node + "'";
      ++count;
    }
    if (count > threads) {
      throw Error(entry.location + ": " + phase_label(phase.name) + "the nodes " + together +
                  " work on each item at the same time, but the phase has " +
                  std::to_string(threads) + " graph thread" + (threads == 1 ? "" : "s") +
                  ": give it threads: " + std::to_string(count) + " or more");
    }
  }
  const std::string problem = thread_budget_problem(stage_decls(phase, registry), phase.run);
  if (problem.empty()) return;
  const std::string where = phase.stages.empty() ? phase.origin : phase.stages.front().location;
  throw Error(where + ": " + phase_label(phase.name) + problem);
}

std::unique_ptr<Pipeline> build_pipeline(const PipelineConfig& config,
                                         const Registry& registry,
                                         const BuildContext& context) {
  auto pipeline = std::make_unique<Pipeline>();
  for (const StageConfig& stage : expanded_stages(config, registry)) {
    std::unique_ptr<Stage> built;
    try {
      built = registered(stage, registry).make(stage.params, context);
    } catch (const std::exception& e) {
      throw Error(stage.location + ": " + phase_label(config.name) +
                  stage_label(stage.name, stage.type) + e.what());
    }
    pipeline->add(stage.name, std::move(built), stage.options);
  }
  return pipeline;
}

std::string stages_markdown(const Registry& registry) {
  std::string out;
  for (const StageInfo* info : registry.all()) {
    out += "### `" + info->type + "`\n\n" + info->doc.summary + "\n\n";
    out += std::string("Kind: ") + to_string(info->shape.kind);
    if (!info->shape.input.is_none()) out += "; takes `" + info->shape.input.name() + "`";
    if (!info->shape.output.is_none()) out += "; emits `" + info->shape.output.name() + "`";
    out += ".\n\n";
    out += params_markdown(info->doc.params, "param", "No parameters.");
  }
  return out;
}

std::string sections_markdown(const std::vector<ConfigSection>& sections) {
  std::string out;
  for (const ConfigSection& section : sections) {
    out += "### `" + section.key + "`\n\n" + section.doc + "\n\n";
    out += params_markdown(section.params, "key", "No keys.");
  }
  return out;
}

std::string stages_text(const Registry& registry) {
  std::string out;
  for (const StageInfo* info : registry.all()) {
    out += info->type + "  (" + to_string(info->shape.kind);
    if (!info->shape.input.is_none()) out += ", takes " + info->shape.input.name();
    if (!info->shape.output.is_none()) out += ", emits " + info->shape.output.name();
    out += ")\n    " + info->doc.summary + "\n";
    for (const ParamSpec& p : info->doc.params) {
      char buf[128];
      std::snprintf(buf, sizeof buf, "    %-16s %-10s %-12s ", p.name.c_str(), to_string(p.type),
                    p.default_text().c_str());
      out += buf + p.doc + (p.choices.empty() ? "" : choices_text(p)) + "\n";
    }
    out += "\n";
  }
  return out;
}

}  // namespace flowtrain
