#pragma once

#include <vector>

#include "graph/pipeline.hpp"
#include "graph/report.hpp"

namespace flowtrain {

/// Runs `pipeline` to its end as `options` say. With `options.autotune.enabled` it first tunes
/// its layout on the run's own work: trials are stretches of the run (Pipeline::request_pause
/// between them), each with one change from the best layout so far (a stage's concurrency or
/// intra-op threads, the graph threads), measured in items the last stage completes per second; the fastest by
/// at least `min_gain` is kept, until no change helps or `max_trials` ran. The rest of the run
/// uses the chosen layout. Every layout fits `options.cores` (thread_budget_problem).
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
///   const RunReport report = autotune_run(*pipeline, phase.run, stage_decls(phase));
RunReport autotune_run(Pipeline& pipeline,
                       const RunOptions& options,
                       const std::vector<StageDecl>& decls);

/// The chosen settings as YAML to paste into the phase (or the top level) of a config:
///   threads: 2
///   stages:            # set these keys on the entries of these names
///     teacher_infer: {concurrency: 2, params: {intraop_threads: 1}}
std::string autotune_yaml(const AutotuneReport& report, const std::string& key_prefix);

}  // namespace flowtrain
