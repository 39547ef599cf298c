#include "graph/config.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <optional>

#include "graph/config/compose.hpp"
#include "graph/config/expand.hpp"
#include "graph/config/suggest.hpp"
#include "graph/config/text.hpp"
#include "graph/config/yaml_values.hpp"
#include "graph/error.hpp"
#include "graph/names.hpp"
#include "graph/plugin.hpp"

// Loading and validating a config. Its rooms, in graph/config/: the YAML values and the
// Locator (yaml_values), the config as text (text: overrides, `${...}`, the effective text),
// composed phases (compose), entries expanded into nodes and the thread budget (expand), the
// suggestions of messages (suggest) and the stage docs (stage_docs).

namespace flowtrain {

namespace {

using namespace detail;

const std::vector<std::string> kTopKeys = {"threads", "cores",  "metrics", "autotune",
                                           "stages",  "phases", "plugins"};
const std::vector<std::string> kPhaseKeys = {"name",     "threads", "cores",   "metrics",
                                             "autotune", "stages",  "extends", "without"};
const std::vector<std::string> kAutotuneKeys = {"enabled",    "warmup_s", "trial_s",
                                                "max_trials", "min_gain", "memory_mb"};
const std::vector<std::string> kMetricsKeys = {"sample_ms", "trace", "drops", "tensorboard"};

// Reads `autotune`: true/false, or a map of AutotuneOptions (`enabled` defaults to true there).
void read_autotune(const YAML::Node& node,
                   const std::string& ctx,
                   const Locator& loc,
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

// Whether the key at `it` of `map` gives `spec`'s value. A param given under both its name and
// its former one takes the spelling an override set (`virtual_stages=2` over a config's
// `chunks_per_partition: 1`); given so twice in the config, it is refused, since which one
// should win is not the config's to guess. `what` leads the message.
bool takes_this_spelling(const YAML::Node& map,
                         const YAML::const_iterator& it,
                         const ParamSpec& spec,
                         const std::string& what,
                         const Locator& loc) {
  if (spec.former_name.empty()) return true;
  const std::string& other = it->first.Scalar() == spec.name ? spec.former_name : spec.name;
  const YAML::Node twin = map[other];
  if (!twin) return true;
  const bool overridden = loc.is_override(it->second);
  if (overridden != loc.is_override(twin)) return overridden;
  loc.fail_key(it, what + "'" + spec.name + "' is given twice, also under its former name '" +
                       spec.former_name + "'; keep one of them");
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
    if (!listed(name) && !listed(InputRef::parse(name).stage)) {
      loc.fail(node, ctx + "input '" + name + "' is not a stage listed before this one" +
                         suggestion(name, known));
    }
  }
  return names;
}

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
        if (!takes_this_spelling(params, it, *spec, stage_ctx + "param ", loc)) continue;
        if (spec->name == info->doc.threads_param && it->second.IsScalar() &&
            it->second.Scalar() == "auto") {
          stage.auto_threads = true;  // the default until resolve_auto_threads
          continue;
        }
        stage.params.set(
            spec->name,
            parse_param(*spec, it->second, stage_ctx + "param '" + key + "' ", base_dir, loc));
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
    checked.inputs = effective_inputs(checked.inputs, info->shape.kind,
                                      config.stages.empty() ? "" : config.stages.back().name);
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
    const ParamSpec* spec = find_param(section.params, key);
    if (!spec) {
      loc.fail_key(it, section.key + ": unknown key '" + key + "'" + suggestion(key, declared));
    }
    if (!takes_this_spelling(map, it, *spec, section.key + ": key ", loc)) continue;
    params.set(spec->name,
               parse_param(*spec, it->second, section.key + "." + key + " ", base_dir, loc));
  }
  return params;
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
  return parse(read_config_file(path), path, std::filesystem::path(path).parent_path(), overrides,
               registry, sections);
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

}  // namespace flowtrain
