#pragma once

// The layout of a graph before anything is built: how each stage runs (StageOptions), how a
// pipeline runs (RunOptions), what the graph checks know of a stage (StageDecl), and the checks
// themselves. Plain data over the standard library: the registry, the config reader and the
// runtime all read it, and it includes nothing of theirs.

#include <cstddef>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "graph/report.hpp"
#include "graph/stage.hpp"

namespace flowtrain {

/// How one stage runs inside a pipeline.
struct StageOptions {
  /// Invocations that may run at once: kSerial (1), N, or kUnlimited (0).
  std::size_t concurrency = kSerial;
  /// Output slots of each input towards this one: items being produced for this stage plus
  /// items waiting for it never exceed this. Must be >= each input's concurrency. A stage whose
  /// output several stages consume gets the smallest of their capacities.
  std::size_t queue_capacity = 8;
  /// Deliver items to this stage in sequence order (forced on for stages that require it).
  bool ordered = false;
  /// Names of the stages this one takes its items from, added before it; empty: the stage
  /// added just before. One for a map, flat map, router or sink; two or more for a join or
  /// merge. A stage's output reaches every stage that names it (fan-out); a router's outputs
  /// are named "router.output".
  std::vector<std::string> inputs;
  /// A declared token edge, the one cycle a graph may have: this stage starts an item only
  /// with a token, and the named flat map downstream of it hands one back each time it calls
  /// `out.send_token()`. The stage holds one token at the start. Items dropped upstream pass
  /// without one. `train_step` waits so for its `optimizer_step`: forward t+1 starts on the
  /// weights of update t, while the data stages work ahead.
  std::string token_from;
};

/// How a pipeline tunes its layout before the rest of its run (graph/autotune.hpp).
struct AutotuneOptions {
  bool enabled = false;
  double warmup_s = 0.5;        // of each trial, and two completions: not measured (queues
                                // filling, a model's first calls)
  double trial_s = 2;           // measured window of each trial, from its first completion
                                // (and 4 completions at least)
  std::size_t max_trials = 10;  // trials in all, the starting layout's included
  double min_gain = 0.03;       // a change is kept if its layout is this much faster (3%)
  /// Resident memory a trial may have added since tuning began (deeper queues hold more
  /// items); a layout over it is not kept.
  double memory_mb = 512;
};

/// How a pipeline runs.
struct RunOptions {
  std::size_t threads = 0;  // TBB threads for the graph (0: one per core granted)
  /// Cores of this machine the job may use (0: one per hardware thread), shared evenly by its
  /// `local_ranks`: the run is granted its share (threads_and_cores). The busiest moment the
  /// graph can reach (`threads` invocations at once, each using its stage's
  /// threads_per_invocation()) must fit the cores granted.
  std::size_t cores = 0;
  /// Ranks of the job on this machine, each running one such pipeline (LOCAL_WORLD_SIZE; set by
  /// run_phases).
  std::size_t local_ranks = 1;
  /// Ranks of the whole job (WORLD_SIZE; set by run_phases): an entry's expansion may depend on
  /// it (StageInfo::expand: a training step split across ranks brings no partition nodes).
  std::size_t ranks = 1;
  double sample_interval_ms = 2;  // how often queue occupancy and stage states are sampled
  std::string trace_path;         // write a Chrome trace-event JSON here when not empty
  /// List every dropped item here (CSV: stage,item,reason) when not empty; the report lists the
  /// first StageReport::kMaxDropRecords of each stage. No file is left when nothing is dropped.
  std::string drops_path;
  /// Write TensorBoard event files of the run's scalars into this folder when not empty (the
  /// runner does: see run_phases; Pipeline::run ignores it).
  std::string tensorboard_dir;
  /// Called every `progress_interval_s` from a background thread while the run lasts.
  std::function<void(const Progress&)> on_progress;
  double progress_interval_s = 1;
  /// Where this pipeline's keys sit in its config, copied to RunReport::key_prefix for the
  /// verdict's advice: "phases.distill." for a phase of a multi-phase config (its
  /// PipelineConfig::run has it), empty for a single pipeline.
  std::string key_prefix;
  /// Tune the layout first (autotune_run; config key `autotune`). Pipeline::run ignores it.
  AutotuneOptions autotune;
};

/// An input that takes every item of its stage (not one output of a router).
inline constexpr std::size_t kAllOutputs = static_cast<std::size_t>(-1);

/// One input of a stage: the stage it comes from and, for a router, which of its outputs.
struct InputLink {
  std::size_t stage = 0;
  std::size_t output = kAllOutputs;
};

/// What the graph checks know of a stage before it is built (a registry entry has the same).
struct StageDecl {
  std::string name;
  StageShape shape;
  StageOptions options;
  /// Threads one invocation keeps busy (Stage::threads_per_invocation), and the param that sets
  /// them ("intraop_threads"; empty when fixed), for the thread budget and its advice.
  std::size_t threads_per_invocation = 1;
  std::string threads_param;
};

/// The inputs a stage takes: the ones it names, or, naming none, the stage listed just before it
/// (`before`; empty for the first). A source gets no default (one that names inputs is
/// refused by add_problem). The one place this default is spelled.
inline std::vector<std::string> effective_inputs(const std::vector<std::string>& named,
                                                 StageShape::Kind kind,
                                                 const std::string& before) {
  if (kind == StageShape::Kind::kSource || !named.empty() || before.empty()) return named;
  return {before};
}

/// Returns a one-line problem with `options` for a stage of this shape, else an empty string.
std::string options_problem(const StageShape& shape, const StageOptions& options);

/// Returns a one-line problem if `next` cannot be added after the stages `earlier` (listed in
/// the order they were added), else an empty string; on success `inputs` holds its inputs
/// (indices in `earlier`, and the router output each takes). Checks the options, the inputs (names,
/// count, kinds, item types, capacities), that a join's inputs are numbered alike and that
/// consumers of a shared output can copy it. Shared by Pipeline::add and config validation so both
/// give the same message.
std::string add_problem(const std::vector<StageDecl>& earlier,
                        const StageDecl& next,
                        std::vector<InputLink>& inputs);

/// Returns a one-line problem if the complete graph `stages` cannot run (the last stage is not a
/// sink; an output nobody consumes), else an empty string.
std::string graph_problem(const std::vector<StageDecl>& stages);

/// The stages among `stages` that take output `output` of stages[p] (kAllOutputs: any of its
/// outputs), in order.
std::vector<std::size_t> consumers_of(const std::vector<StageDecl>& stages,
                                      std::size_t p,
                                      std::size_t output = kAllOutputs);

/// The most threads the graph of `stages` can keep busy at once on `threads` graph threads:
/// that many invocations running together, the ones using the most threads (intra-op math)
/// first, each stage at the concurrency it can reach.
std::size_t peak_threads(const std::vector<StageDecl>& stages, std::size_t threads);

/// The graph threads and the cores granted to a run with `options`: the cores are its share of
/// `cores` (or of the hardware threads) among `local_ranks`, at least 1; the threads default to
/// the cores granted. Without `cores`, explicit `threads` beyond the share raise it to them.
std::pair<std::size_t, std::size_t> threads_and_cores(const RunOptions& options);

/// Returns a one-line problem if the busiest moment of `stages` run with `options` (threads and
/// cores; 0: one per hardware thread) would need more threads than the cores granted, else an
/// empty string. Checked when a config is loaded (every phase, before the first runs) and again
/// by Pipeline::run.
std::string thread_budget_problem(const std::vector<StageDecl>& stages, const RunOptions& options);

/// The graph as text, one line per stage with its kind, inputs and options, for `flowtrain check`:
///   numbers   source                       concurrency 1
///   square    map      <- numbers          concurrency 4, queue 16
std::string graph_text(const std::vector<StageDecl>& stages);

}  // namespace flowtrain
