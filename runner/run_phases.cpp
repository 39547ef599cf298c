#include "runner/run_phases.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>

#include "distributed/job.hpp"
#include "distributed/launch.hpp"
#include "distributed/world.hpp"
#include "graph/autotune.hpp"
#include "graph/error.hpp"
#include "graph/freed_memory.hpp"
#include "graph/pipeline.hpp"
#include "graph/tensorboard.hpp"

namespace flowtrain::runner {

using dist::World;
using dist::WorldOptions;

namespace {

std::string default_progress(const Progress& p) {
  const double rate = p.elapsed_s > 0 ? static_cast<double>(p.completed) / p.elapsed_s : 0;
  char buf[160];
  std::snprintf(buf, sizeof buf, "%8.1f s  produced %llu  completed %llu  %.0f items/s",
                p.elapsed_s, static_cast<unsigned long long>(p.produced),
                static_cast<unsigned long long>(p.completed), rate);
  return buf;
}

// "rank 1: wall 2.31 s, 'work' busy 87%, 'train_step' steps 6 loss 0.0312": what rank 0
// prints for every rank after a phase of a data-parallel job, and the first drop of each stage
// that dropped items (", 'decode' dropped 1 (item 17: a.jpg: not a JPEG)").
std::string rank_summary(int rank, const RunReport& report) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "rank %d: wall %.2f s", rank, report.wall_s);
  std::string line = buf;
  if (const std::optional<std::size_t> b = report.bottleneck()) {
    const StageReport& s = report.stages[*b];
    std::snprintf(buf, sizeof buf, ", '%s' busy %.0f%%", s.name.c_str(), s.busy_fraction * 100);
    line += buf;
  }
  for (const StageReport& s : report.stages) {
    if (s.results.empty()) continue;
    line += ", '" + s.name + "'";
    for (const StageResult& result : s.results) {
      std::snprintf(buf, sizeof buf, " %s %.4g", result.name.c_str(), result.value);
      line += buf;
    }
  }
  for (const StageReport& s : report.stages) {
    if (s.dropped == 0) continue;
    line += ", '" + s.name + "' dropped " + std::to_string(s.dropped);
    if (!s.drops.empty()) {
      line += " (item " + std::to_string(s.drops[0].seq) + ": " + s.drops[0].reason + ")";
    }
  }
  return line;
}

// The phases to run, in order: the named ones, or all.
std::vector<PipelineConfig*> selected(RunConfig& config, const RunPhasesOptions& options) {
  std::vector<PipelineConfig*> out;
  if (options.phases.empty()) {
    for (PipelineConfig& phase : config.phases) out.push_back(&phase);
    return out;
  }
  std::string known;
  for (const PipelineConfig& phase : config.phases) known += (known.empty() ? "" : ", ") + phase.name;
  for (const std::string& name : options.phases) {
    const auto it = std::find_if(config.phases.begin(), config.phases.end(),
                                 [&](const PipelineConfig& p) { return p.name == name; });
    if (it == config.phases.end()) {
      throw Error(config.origin + ": no phase named '" + name + "' (" +
                  (known.empty() ? "it is one pipeline, without phases" : "it has: " + known) +
                  ")");
    }
    out.push_back(&*it);
  }
  return out;
}

}  // namespace

PhasesOutcome run_phases(RunConfig& config,
                         const RunPhasesOptions& options,
                         const PhaseHooks& hooks) {
  check_timeout(options.timeout_s);
  keep_freed_memory();  // a training step's activations, reused rather than faulted in again
  const std::vector<PipelineConfig*> phases = selected(config, options);
  // Where this process stands in its job: read once, here, and handed to the stages.
  JobPlacement placement = job_placement_from_env();
  for (PipelineConfig* phase : phases) {  // all, before any runs
    plan_for_job(*phase, placement);
  }
  World* world = nullptr;
  if (placement.distributed()) {
    WorldOptions world_options;
    world_options.timeout =
        std::chrono::milliseconds(static_cast<std::int64_t>(options.timeout_s * 1000));
    world_options.config_hash =
        dist::config_file_fingerprint(options.config_path, options.overrides);
    world = World::init(placement, world_options);
  }
  PhasesOutcome outcome;
  outcome.leader = !world || world->rank() == 0;
  const bool leader = outcome.leader;
  if (hooks.joined) hooks.joined(leader);
  const bool terminal = leader && isatty(STDERR_FILENO) != 0;

  for (std::size_t i = 0; i < phases.size(); ++i) {
    PipelineConfig& phase = *phases[i];
    const std::string what = phase.name.empty() ? "run" : "phase " + phase.name;
    phase.run.progress_interval_s = terminal ? 0.5 : options.progress_interval_s;
    if (leader) {
      std::function<std::string(const Progress&)> line =
          hooks.progress ? hooks.progress(phase) : default_progress;
      phase.run.on_progress = [line, terminal](const Progress& p) {
        std::fprintf(stderr, terminal ? "\r%s\x1b[K" : "%s\n", line(p).c_str());
        std::fflush(stderr);
      };
    }
    if (hooks.prepare) hooks.prepare(phase, leader);
    BuildContext context;
    context.provide(placement);
    if (world) context.provide(*world);
    // TensorBoard: rank 0 writes a run folder for each phase (DIR/NAME), so that its curves sit
    // beside the other phases'.
    std::unique_ptr<EventWriter> events;
    if (leader && !phase.run.tensorboard_dir.empty()) {
      events = std::make_unique<EventWriter>(
          phase.name.empty() ? phase.run.tensorboard_dir
                             : (std::filesystem::path(phase.run.tensorboard_dir) / phase.name)
                                   .string());
      context.provide(*events);
      phase.run.on_progress = [print = phase.run.on_progress, to = events.get(),
                               failed = false](const Progress& p) mutable {
        if (print) print(p);
        const auto second = static_cast<std::int64_t>(std::llround(p.elapsed_s));
        try {
          for (const StageProgress& stage : p.stages) {
            to->scalar("busy/" + stage.name, second, stage.busy_fraction);
          }
        } catch (const std::exception& e) {  // on the sampler's thread: said once, not thrown
          if (!failed) std::fprintf(stderr, "tensorboard: %s\n", e.what());
          failed = true;
        }
      };
    }
    // Autotune fixes a training step's intra-op threads on rehearsals, before the phase is
    // built. Each rank would choose its own, so with several they stay as configured.
    std::optional<AutotuneReport> rehearsed;
    if (!world) rehearsed = autotune_rehearse(phase, context);
    std::unique_ptr<Pipeline> pipeline = build_pipeline(phase, Registry::global(), context);
    if (leader) {
      // The nodes the report lists, the ones a `train_step` entry brings included.
      const std::size_t nodes = pipeline->decls().size();
      if (phase.name.empty()) {
        std::cout << "running " << config.origin << ": " << nodes << " stages";
      } else {
        std::cout << "phase " << phase.name << " (" << i + 1 << "/" << phases.size()
                  << "): " << nodes << " stages";
      }
      if (world) std::cout << " on each of " << world->size() << " ranks";
      std::cout << std::endl;
    }
    RunReport report;
    int signal = 0;
    {
      // A rank of a job votes, and stops with the others after the same step (StopVote).
      StopOnSignal stop_on_signal(*pipeline, world ? &world->stop_vote() : nullptr);
      report = autotune_run(*pipeline, phase.run, stage_decls(phase), std::move(rehearsed));
      signal = stop_on_signal.received();
    }
    // A rank still waiting in a collective of this phase learns that this one is done: their
    // step counts differ (World::wait).
    if (world && !report.stopped) {
      world->finished_phase(what + " (" + rank_summary(world->rank(), report) + ")");
    }
    if (events) {  // at the phase's last second: its shares, and what each stage reported
      const std::int64_t second = std::llround(report.wall_s);
      for (const StageReport& stage : report.stages) {
        events->scalar("busy/" + stage.name, second, stage.busy_fraction);
        for (const StageResult& result : stage.results) {
          events->scalar("results/" + stage.name + "/" + result.name, second, result.value);
        }
      }
      events->flush();
    }
    if (terminal && report.wall_s >= phase.run.progress_interval_s) std::fprintf(stderr, "\n");
    if (leader) {
      std::cout << format_report(report);
      if (report.autotune && !report.autotune->overrides.empty()) {
        std::cout << autotune_yaml(*report.autotune, phase.run.key_prefix);
      }
      std::cout << std::flush;
    }
    if (report.stopped) {
      outcome.stopped = std::string(signal == SIGTERM ? "SIGTERM" : "SIGINT") + " during " +
                        (phase.name.empty() ? "the run" : what);
      outcome.reports.push_back(std::move(report));
      // Later phases would build on an unfinished one. The other ranks were stopped too (by the
      // launcher, or Slurm), or learn it from the store.
      if (world) world->report_failure("stopped by " + *outcome.stopped);
      return outcome;
    }
    if (hooks.finished) hooks.finished(phase, report, leader);
    if (world) {
      const std::vector<std::string> lines =
          world->gather_text("summaries of " + what, rank_summary(world->rank(), report));
      if (leader) {
        std::cout << "per rank:\n";
        for (const std::string& line : lines) std::cout << "  " << line << "\n";
        std::cout << std::flush;
      }
      // Every rank starts the next phase together, after whatever this one wrote.
      world->barrier("end of " + what);
    }
    outcome.reports.push_back(std::move(report));
  }
  World::shutdown();
  return outcome;
}

void check_timeout(double timeout_s) {
  if (timeout_s > 0 && timeout_s <= kMaxTimeoutS) return;  // false for nan
  char got[32];
  std::snprintf(got, sizeof got, "%g", timeout_s);
  throw Error("--timeout must be a number of seconds above 0 and at most " +
              std::to_string(static_cast<long long>(kMaxTimeoutS)) + ", got " + got);
}

void plan_for_job(PipelineConfig& phase, const JobPlacement& job) {
  // Local ranks share the machine's cores: each gets its share, and `auto` threads fill it.
  // A launcher that grants each rank its CPUs (Slurm's --cpus-per-task) sets the machine's
  // cores where the config does not.
  phase.run.ranks = static_cast<std::size_t>(job.world_size);
  phase.run.local_ranks = static_cast<std::size_t>(job.local_world_size);
  if (phase.run.cores == 0 && job.cpus_per_rank > 0) {
    phase.run.cores = phase.run.local_ranks * static_cast<std::size_t>(job.cpus_per_rank);
  }
  resolve_auto_threads(phase);
  check_thread_budget(phase);
}

int relaunch_as_ranks(int nproc, int argc, char** argv) {
  return relaunch_as_ranks(nproc, dist::args_without_nproc(argc, argv));
}

int relaunch_as_ranks(int nproc, std::vector<std::string> args) {
  const JobPlacement placement = job_placement_from_env();
  if (placement.distributed()) {
    throw Error("--nproc starts its own ranks, but this process already is rank " +
                std::to_string(placement.rank) + " of " + std::to_string(placement.world_size) +
                " (from " + placement.launcher + "'s environment): drop --nproc");
  }
  const std::string program = std::filesystem::read_symlink("/proc/self/exe").string();
  if (!args.empty()) args[0] = program;
  return dist::launch_local({.nproc = nproc, .program = program, .args = std::move(args)},
                            std::cerr);
}

}  // namespace flowtrain::runner
