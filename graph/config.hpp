#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "graph/params.hpp"
#include "graph/pipeline.hpp"
#include "graph/registry.hpp"

namespace flowtrain {

/// One validated entry of a pipeline config's `stages:` list.
struct StageConfig {
  std::string type;
  std::string name;
  StageOptions options;
  Params params;
  std::string location;  // "demo.yaml:12", for messages about this stage
  /// Its threads param (StageDoc::threads_param) was `auto`: resolve_auto_threads sets it.
  bool auto_threads = false;
};

/// A pipeline config, fully validated against the registry: building it cannot fail on
/// anything the config says.
///
///   threads: 2                 # TBB threads for the graph (default: all hardware threads)
///   cores: 4                   # cores the run may use (default: all hardware threads)
///   metrics: {sample_ms: 2, trace: run.trace.json}
///   stages:
///     - {type: sequence, name: numbers, params: {count: 100000}}
///     - {type: spin, concurrency: 2, queue_capacity: 8, params: {microseconds: 20}}
///     - {type: discard}
struct PipelineConfig {
  std::string origin;  // file path, or a label for configs given as text
  std::string name;    // the phase's name in a multi-phase config; empty otherwise
  RunOptions run;
  std::vector<StageConfig> stages;
};

/// A top-level map an application reads from its config beside `stages:`/`phases:` (foodtag's
/// `data:`), declared like stage params: validated (unknown key with did-you-mean, types,
/// file:line) and documented from one source.
///
///   const std::vector<ConfigSection> kSections = {
///       {"data", "where the photos are and how they are split",
///        {path_param("folder", "prepared data folder"),
///         float_param("val_fraction", 0.2, "share held out for validation", 0)}}};
///   const RunConfig config = load_run_config("foodtag.yaml", overrides, kSections);
///   const double val = config.sections.at("data").get_float("val_fraction");
struct ConfigSection {
  std::string key;
  std::string doc;
  std::vector<ParamSpec> params;
};

/// A config of pipelines run one after another, every one validated before the first runs.
/// A single-pipeline config (with `stages:`) gives one phase with an empty name; a multi-phase
/// config lists them under `phases:`, each inheriting the top-level threads, cores and metrics:
///
///   threads: 2
///   phases:
///     - name: teacher
///       stages: [...]
///     - name: student
///       threads: 1               # overrides the top-level default for this phase
///       stages: [...]
///
///   const RunConfig config = load_run_config("kd.yaml", {"phases.student.threads=2"});
///   for (const PipelineConfig& phase : config.phases) build_pipeline(phase)->run(phase.run);
struct RunConfig {
  std::string origin;
  std::vector<PipelineConfig> phases;
  /// Each declared ConfigSection by key, present even if the config omits it: defaults filled
  /// in, paths resolved against the config's folder as for stage params.
  std::map<std::string, Params> sections;
  /// The config after the overrides, as YAML to save beside a run's outputs: a comment line
  /// naming the origin and the overrides, then the keys. Path params (of stages and sections)
  /// are written resolved and absolute, so the text reads the same from any folder; a value
  /// that refers to another key (`${output.dir}/teacher`) is written with its reference, so
  /// an override of that key moves it too.
  std::string effective_text;
};

/// Reads and validates a config file with `stages:` or `phases:`. `overrides` are
/// `key.path=value` strings applied first (`threads=1`, `stages.work.concurrency=4`,
/// `phases.distill.stages.student.params.lr=0.01`, `data.val_fraction=0.3`). Throws Error with
/// one line naming the file, line, phase, stage and key of the first problem.
RunConfig load_run_config(const std::string& path,
                          const std::vector<std::string>& overrides = {},
                          const Registry& registry = Registry::global());

/// The same, also accepting the application's own top-level `sections` beside the known keys
/// (a top-level key that is neither fails, with did-you-mean over both).
RunConfig load_run_config(const std::string& path,
                          const std::vector<std::string>& overrides,
                          const std::vector<ConfigSection>& sections,
                          const Registry& registry = Registry::global());

/// Only the application's `sections` of a config file (overrides and `${...}` applied, the
/// top-level keys checked), without validating its stages: for work that must happen before
/// the stages' inputs exist (foodtag's prepare writes the manifests its phases read).
std::map<std::string, Params> load_config_sections(const std::string& path,
                                                   const std::vector<std::string>& overrides,
                                                   const std::vector<ConfigSection>& sections);

/// The same for config text; `origin` names it in messages.
RunConfig parse_run_config(const std::string& text,
                           const std::string& origin,
                           const std::vector<std::string>& overrides = {},
                           const Registry& registry = Registry::global());

/// The same for config text with application sections; `origin` names it in messages.
RunConfig parse_run_config(const std::string& text,
                           const std::string& origin,
                           const std::vector<std::string>& overrides,
                           const std::vector<ConfigSection>& sections,
                           const Registry& registry = Registry::global());

/// Reads and validates a single-pipeline config file (one with `stages:`; a config with
/// `phases:` throws Error pointing to load_run_config). `overrides` are as for load_run_config.
PipelineConfig load_pipeline_config(const std::string& path,
                                    const std::vector<std::string>& overrides = {},
                                    const Registry& registry = Registry::global());

/// The same for config text; `origin` names it in messages.
PipelineConfig parse_pipeline_config(const std::string& text,
                                     const std::string& origin,
                                     const std::vector<std::string>& overrides = {},
                                     const Registry& registry = Registry::global());

/// Throws Error (naming the phase and the file:line of its first stage) if the busiest moment
/// of the phase could need more threads than its `cores` (thread_budget_problem). Run before
/// the first phase for every phase that will run: a phase a command does not run may be
/// configured for another machine share.
///   for (const PipelineConfig& phase : config.phases) check_thread_budget(phase);
void check_thread_budget(const PipelineConfig& phase, const Registry& registry = Registry::global());

/// Sets the threads param of every stage configured with `intraop_threads: auto` to the most
/// threads that keep the phase within its cores granted (thread_budget_problem; all such stages
/// alike, at least 1). Done when a config is read, and again by run_phases once it knows how
/// many ranks share the machine (RunOptions::local_ranks).
///   phase.run.local_ranks = 2;
///   resolve_auto_threads(phase);
void resolve_auto_threads(PipelineConfig& phase, const Registry& registry = Registry::global());

/// Constructs the stages of a validated config (one phase). Errors thrown by a stage's
/// constructor (a file it cannot open, say) come back as Error prefixed with the stage's
/// location and name, and the phase's name. Each stage is built with `context`: the run's
/// services, such as the job's process group.
std::unique_ptr<Pipeline> build_pipeline(const PipelineConfig& config,
                                         const Registry& registry = Registry::global(),
                                         const BuildContext& context = {});

/// The nodes a config (one phase) runs: its entries in order, each entry whose output no other
/// entry takes followed by the nodes it expands into (StageInfo::expand: a `train_step` brings
/// its step log, checkpoint and snapshot writers), named "<entry>/<node>" and taking the
/// entry's output. (An entry that follows another with no `inputs` takes its output, so it is
/// never preceded by an expansion.)
std::vector<StageConfig> expanded_stages(const PipelineConfig& config,
                                         const Registry& registry = Registry::global());

/// The entry of `entries` that the input `name` takes from: the one so named, or the router of a
/// router's output ("teacher.miss"); std::nullopt if none.
std::optional<std::size_t> entry_index(const std::vector<StageConfig>& entries,
                                       const std::string& name);

/// The phase cut to its entry `output`: that entry and the entries it depends on, in order, each
/// naming its inputs (a default input, the entry before, spelled out, since the cut may drop
/// that entry). What runs to take one entry's items (the Python Loader). Throws Error if no
/// entry is named `output`.
PipelineConfig cut_phase(const PipelineConfig& phase,
                         const std::string& output,
                         const Registry& registry = Registry::global());

/// The nodes of a validated config (expanded_stages) as the graph checks and graph_text see them:
///   std::cout << graph_text(stage_decls(phase));
std::vector<StageDecl> stage_decls(const PipelineConfig& config,
                                   const Registry& registry = Registry::global());

/// Markdown reference of every registered stage and its parameters (docs/config.md embeds it).
std::string stages_markdown(const Registry& registry = Registry::global());

/// Markdown reference of application config sections: per section a heading, its doc and a
/// table of its keys (type, default, meaning) like the stage params of stages_markdown.
///   out << sections_markdown(foodtag::config_sections());
std::string sections_markdown(const std::vector<ConfigSection>& sections);

/// Plain-text listing of every registered stage, for `flowtrain stages`.
std::string stages_text(const Registry& registry = Registry::global());

}  // namespace flowtrain
