#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "distributed/job.hpp"
#include "graph/config.hpp"
#include "graph/report.hpp"

namespace flowtrain::runner {

/// What an application adds to a run of phases; every hook is optional.
struct PhaseHooks {
  /// Once, after this process joined its job (or found it runs alone): `leader` is rank 0.
  std::function<void(bool leader)> joined;
  /// Before a phase is built, on every rank: set its trace path, say.
  std::function<void(PipelineConfig& phase, bool leader)> prepare;
  /// The progress line of a phase (rank 0 only), from a snapshot; default: elapsed time, items
  /// produced and completed, and the rate.
  std::function<std::function<std::string(const Progress&)>(const PipelineConfig& phase)> progress;
  /// After a phase ran to its end, on every rank, before the ranks wait for each other: print or
  /// save what the application adds to the report (rank 0 has already printed the report).
  std::function<void(const PipelineConfig& phase, const RunReport& report, bool leader)> finished;
};

/// How run_phases runs.
struct RunPhasesOptions {
  std::string config_path;             // in the job's config fingerprint and in messages
  std::vector<std::string> overrides;  // the same
  double timeout_s = 300;              // collectives and barriers as a rank of a job
  double progress_interval_s = 10;     // progress lines when stderr is no terminal (else 0.5 s)
  std::vector<std::string> phases;     // the phases to run, in order; empty: all, as listed
};

/// What a run of phases did on this process.
struct PhasesOutcome {
  bool leader = true;               // rank 0, or a process on its own
  std::vector<RunReport> reports;   // of the phases that ran, in order
  /// Set when a signal stopped a phase: "SIGINT during phase distill". The phases after it did
  /// not run, and the other ranks were told.
  std::optional<std::string> stopped;
};

/// Runs the phases of a validated config one after another, each built just before it runs (so
/// it can read what earlier ones wrote), the process keeping the memory it frees for reuse
/// (keep_freed_memory, graph/freed_memory.hpp). As a rank of a data-parallel job (the launcher's
/// environment says so) it joins the job first; rank 0 prints each phase's header, a progress
/// line while it runs, its report and one line per rank after it; every rank starts a phase
/// together. SIGINT or SIGTERM stops the running phase at the next item and the run there.
///
///   flowtrain::RunConfig config = flowtrain::load_run_config(path, overrides);
///   const PhasesOutcome outcome = run_phases(config, {.config_path = path});
///   return outcome.stopped ? 130 : 0;
PhasesOutcome run_phases(RunConfig& config,
                         const RunPhasesOptions& options,
                         const PhaseHooks& hooks = {});

/// The longest a rank waits for the others: a wait adds it to the clock (Gloo in milliseconds).
inline constexpr double kMaxTimeoutS = 1e6;

/// Throws Error("--timeout must be ...") unless `timeout_s` is a number of seconds above 0 and at
/// most kMaxTimeoutS (11.6 days): nan, inf, -1 or 1e308 would never time out or overflow the
/// clock. run_phases checks its options with it; an app checks its --timeout before starting
/// ranks.
///   check_timeout(timeout_s);
void check_timeout(double timeout_s);

/// Plans `phase` for a rank placed as `job` says: its ranks (RunOptions::ranks: an entry's
/// expansion may depend on them), the ranks sharing this machine's cores (RunOptions::
/// local_ranks; `auto` intra-op threads fill each rank's share) and the CPUs the launcher grants
/// each rank (JobPlacement::cpus_per_rank, which set the machine's `cores` where the config does
/// not); throws Error if it needs more threads than a rank's share (check_thread_budget).
/// run_phases does it for every phase before the first runs; a launcher does it before it
/// starts the ranks, as their rank 0, so that a config that cannot fit is one line rather than
/// one from each rank.
///   for (PipelineConfig& phase : config.phases)
///     plan_for_job(phase, {.world_size = nproc, .local_world_size = nproc});
void plan_for_job(PipelineConfig& phase, const JobPlacement& job);

/// `PROGRAM ... --nproc N`: runs this program's command line again without --nproc as N local
/// ranks of a job and returns the job's exit code. Throws Error if this process already is a
/// rank of a job (drop --nproc).
int relaunch_as_ranks(int nproc, int argc, char** argv);

/// The same with the ranks' command line given: `args[0]` is the program (this executable).
int relaunch_as_ranks(int nproc, std::vector<std::string> args);

}  // namespace flowtrain::runner
