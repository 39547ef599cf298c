#pragma once

#include <optional>
#include <vector>

#include "graph/build_context.hpp"
#include "graph/config.hpp"
#include "graph/pipeline.hpp"
#include "graph/report.hpp"

namespace flowtrain {

/// Runs `pipeline` to its end as `options` say. With `options.autotune.enabled` it first tunes
/// its layout on the run's own work: trials are stretches of the run (Pipeline::request_pause
/// between them), each with one change from the best layout so far (a stage's concurrency or
/// intra-op threads, the graph threads), measured in items the last stage completes per
/// second (after `warmup_s` and two completions, over `trial_s` and 4 completions at least
/// from the next one);
/// the fastest by at least `min_gain` is kept, until no change helps or `max_trials`
/// ran. The rest of the run uses the chosen layout. Every layout fits `options.cores`
/// (thread_budget_problem).
///
/// Nothing a trial changes alters the results: the stream carries on across trials, graph
/// threads and concurrency never change them, and only stages whose results do not depend on
/// their intra-op threads accept new ones (Stage::set_threads_per_invocation; a training step's
/// do, so it keeps its own). The weights equal those of a run configured with the chosen
/// layout, bit for bit.
///
/// `decls` are the stages as the config declares them (stage_decls), which name each one's
/// threads param for the chosen settings' keys; entries a config expands into ("student/step_log")
/// and sources are not tuned. The report's `autotune` lists the trials and the chosen settings.
/// With `rehearsed` (what autotune_rehearse chose, the pipeline built with it) the search goes
/// on from that layout on the run's own work with the trials left of `max_trials` (none if
/// fewer than 2 are left), the step's threads fixed; the report's `autotune` holds the
/// rehearsals' trials, then the run's, and the settings of both.
///   std::optional<AutotuneReport> rehearsed = autotune_rehearse(phase, context);
///   std::unique_ptr<Pipeline> pipeline = build_pipeline(phase, Registry::global(), context);
///   const RunReport report = autotune_run(*pipeline, phase.run, stage_decls(phase), rehearsed);
RunReport autotune_run(Pipeline& pipeline,
                       const RunOptions& options,
                       const std::vector<StageDecl>& decls,
                       std::optional<AutotuneReport> rehearsed = std::nullopt);

/// Before `phase` is built, with autotune on: fixes the intra-op threads of the stages whose
/// results depend on them (StageDoc::threads_change_results: a training step's gradient sums),
/// which must not change once the first step is committed. For each count that fits the cores
/// (the configured one, then 1, 2, 4, ... and all of them) it builds a throwaway copy of the
/// phase (a rehearsal: BuildContext::rehearsal, whose stages write nothing and whose updates
/// are never committed), tunes the rest of its layout there with a short search (max(3,
/// max_trials / (2 x counts)) trials of half `trial_s`, no deeper queues), and keeps the
/// fastest: `phase` is changed to that count and layout, and the run built from it
/// (autotune_run goes on tuning it) is then bit-identical to one configured with the final
/// settings. Returns the trials (each `rehearsal`) and the chosen
/// settings, or nothing (leaving `phase` as it was) if autotune is off, no stage's threads
/// change its results, or there is one core. Throws Error if a SIGINT or SIGTERM stops it.
std::optional<AutotuneReport> autotune_rehearse(PipelineConfig& phase,
                                                const BuildContext& context = {},
                                                const Registry& registry = Registry::global());

/// The chosen settings as YAML to paste into the phase (or the top level) of a config:
///   threads: 2
///   stages:            # set these keys on the entries of these names
///     teacher_infer: {concurrency: 2, params: {intraop_threads: 1}}
std::string autotune_yaml(const AutotuneReport& report, const std::string& key_prefix);

}  // namespace flowtrain
