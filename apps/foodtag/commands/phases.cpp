#include <iostream>
#include <memory>

#include "apps/foodtag/commands/command.hpp"
#include "apps/foodtag/profile.hpp"
#include "runner/run_phases.hpp"
#include "distributed/job.hpp"
#include "distributed/world.hpp"
#include "graph/atomic_file.hpp"
#include "graph/csv.hpp"
#include "graph/error.hpp"
#include "graph/report_io.hpp"
#include "stages/train/files/checkpoint.hpp"
#include "stages/train/files/folder_lock.hpp"

namespace foodtag {

using flowtrain::Error;
using flowtrain::Params;

namespace {

std::uint64_t source_epochs(const flowtrain::PipelineConfig& phase) {
  const std::map<std::string, flowtrain::ParamValue>& params = phase.stages.front().params.values();
  const auto it = params.find("epochs");
  if (it == params.end()) return 0;
  const std::int64_t* epochs = std::get_if<std::int64_t>(&it->second);
  return epochs ? static_cast<std::uint64_t>(*epochs) : 0;
}

// Validation along the training: each snapshot of the model the training wrote
// (`snapshot_every`) and its final model, through the eval phase; then one line of top-1s,
// MODEL/validation.csv for the report, and the snapshots deleted (they were only for this).
void validate_snapshots(const Context& ctx,
                        const flowtrain::RunConfig& config,
                        const std::string& model,
                        const std::string& eval_phase,
                        std::uint64_t final_step) {
  const fs::path dir = ctx.out_dir / model;
  const std::vector<std::string> snapshots =
      flowtrain::train::step_checkpoints((dir / "snapshots").string());
  const auto phase = std::find_if(config.phases.begin(), config.phases.end(),
                                  [&](const auto& p) { return p.name == eval_phase; });
  if (snapshots.empty() || phase == config.phases.end()) return;
  std::vector<std::pair<std::uint64_t, std::string>> models;
  for (const std::string& path : snapshots) {
    // step-00000027.pt
    models.emplace_back(std::stoull(fs::path(path).stem().string().substr(5)), path);
  }
  const fs::path final_model = dir / "final.pt";
  models.emplace_back(final_step, final_model.string());
  std::string csv = "step,top1,top5,mae\n", line = "validation top-1 along the training:";
  for (const auto& [step, path] : models) {
    flowtrain::PipelineConfig run = *phase;
    for (flowtrain::StageConfig& stage : run.stages) {
      if (stage.type != "evaluate") continue;
      stage.params.set("model", path);
      stage.params.set("predictions",
                       std::string());  // the eval command's, of the final model only
    }
    const flowtrain::RunReport report = flowtrain::build_pipeline(run)->run(run.run);
    const double top1 = stage_result(report, "top1").value_or(-1);
    csv += flowtrain::csv_line({std::to_string(step), flowtrain::csv_number(top1),
                                flowtrain::csv_number(stage_result(report, "top5").value_or(-1)),
                                flowtrain::csv_number(stage_result(report, "mae").value_or(-1))});
    // Appended in two steps: GCC 12 warns (a false -Wstringop-overflow) on `" " + temporary`
    // inlined here.
    line += ' ';
    line += flowtrain::csv_number(top1, "%.2f");
  }
  flowtrain::write_file_atomically((dir / "validation.csv").string(), csv);
  std::error_code ec;
  fs::remove_all(dir / "snapshots", ec);
  std::cout << line << " (steps " << models.front().first << " to " << models.back().first << ", "
            << eval_phase << "; " << (dir / "validation.csv").string() << ")\n";
}

}  // namespace

std::function<std::string(const flowtrain::Progress&)> progress_line(
    const flowtrain::PipelineConfig& phase) {
  auto line = std::make_shared<ProgressLine>(phase.name, source_epochs(phase));
  return [line](const flowtrain::Progress& p) { return line->next(p); };
}

void run_phases(const Context& ctx, const std::string& command) {
  if (nothing_to_train(ctx, command)) return;
  PhasePlan plan = check_phases(ctx, command, ctx.in.overrides);
  if (flowtrain::job_placement_from_env().rank == 0) {
    for (const std::string& line : plan.skipped) std::cout << line << "\n";
  }
  flowtrain::RunConfig& config = plan.config;
  const Params& output = ctx.section("output");
  flowtrain::runner::PhaseHooks hooks;
  std::vector<std::string> tuned;  // the settings autotune chose, as overrides
  const fs::path saved_config = ctx.out_dir / "config.yaml";
  // One command at a time in a run folder: a second is refused before it writes anything
  // (each rank holds its own lock, as train_step's checkpoint folders do).
  std::unique_ptr<flowtrain::train::FolderLock> lock;
  hooks.joined = [&](bool leader) {
    const flowtrain::dist::World* world = flowtrain::dist::World::current();
    const std::string rank = leader || !world ? "" : ".rank" + std::to_string(world->rank());
    try {
      lock = std::make_unique<flowtrain::train::FolderLock>(ctx.out_dir.string(),
                                                            ".foodtag.lock" + rank);
    } catch (const Error& e) {
      throw Error(std::string("output folder ") + e.what() + " (output.dir)");
    }
    if (leader) flowtrain::write_file_atomically(saved_config.string(), config.effective_text);
  };
  hooks.progress = progress_line;
  hooks.prepare = [&](flowtrain::PipelineConfig& phase, bool leader) {
    if (leader && output.get_bool("trace")) {
      phase.run.trace_path = (ctx.out_dir / ("trace-" + phase.name + ".json")).string();
    }
    if (output.get_bool("tensorboard")) phase.run.tensorboard_dir = (ctx.out_dir / "tensorboard").string();
    // Every photo a rank dropped, beyond the report's first 100 a stage.
    const flowtrain::dist::World* world = flowtrain::dist::World::current();
    const std::string rank = leader || !world ? "" : ".rank" + std::to_string(world->rank());
    phase.run.drops_path = (ctx.out_dir / ("drops-" + phase.name + rank + ".csv")).string();
  };
  hooks.finished = [&](const flowtrain::PipelineConfig& phase, const flowtrain::RunReport& report,
                       bool leader) {
    if (!leader) return;
    if (const std::string split = step_split(report); !split.empty()) std::cout << split << "\n";
    if (const std::string cache = cache_summary(report); !cache.empty()) std::cout << cache << "\n";
    std::cout << std::flush;
    flowtrain::write_report_file(report, ctx.profile(phase.name).string());
    if (report.autotune) {
      // The saved config takes the chosen layout (and no more tuning there): the next run
      // from it starts tuned. Also when the config's own layout won: tuning again would only
      // find it again.
      tuned.insert(tuned.end(), report.autotune->overrides.begin(),
                   report.autotune->overrides.end());
      tuned.push_back(phase.run.key_prefix + "autotune=false");
      std::vector<std::string> overrides = ctx.in.overrides;
      overrides.insert(overrides.end(), tuned.begin(), tuned.end());
      flowtrain::write_file_atomically(saved_config.string(),
                                       load_phases(ctx.in.config_path, overrides).effective_text);
      std::cout << saved_config.string() << ": saved with the layout autotune chose for phase "
                << phase.name << " (autotune off there), to start the next run tuned\n"
                << std::flush;
    }
  };
  const flowtrain::runner::PhasesOutcome outcome =
      flowtrain::runner::run_phases(config,
                                  {.config_path = ctx.in.config_path,
                                   .overrides = ctx.in.overrides,
                                   .timeout_s = ctx.in.timeout_s,
                                   .progress_interval_s = output.get_float("progress_interval_s"),
                                   .phases = plan.phases},
                                  hooks);
  if (outcome.stopped) throw Error("stopped by " + *outcome.stopped);
  std::uint64_t trained_steps = 0;  // by the training stage of the phases run
  for (const flowtrain::RunReport& report : outcome.reports) {
    if (const std::optional<double> steps = stage_result(report, "steps")) {
      trained_steps = static_cast<std::uint64_t>(*steps);
    }
  }
  if (outcome.leader && command == "train-teacher") {
    validate_snapshots(ctx, config, "teacher", "teacher_eval", trained_steps);
  }
  if (outcome.leader && command == "distill") {
    validate_snapshots(ctx, config, "student", "student_eval", trained_steps);
  }
  if (outcome.leader && command == "baseline") {
    validate_snapshots(ctx, config, "baseline", "baseline_eval", trained_steps);
  }
}

void launch_phases(const Context& ctx, const std::string& command) {
  if (nothing_to_train(ctx, command)) return;
  check_phases(ctx, command, ctx.in.overrides);  // one line for a problem, not one per rank
  std::vector<std::string> args = {ctx.in.program, command,
                                   "-c",           ctx.in.config_path,
                                   "--timeout",    std::to_string(ctx.in.timeout_s)};
  args.insert(args.end(), ctx.in.overrides.begin(), ctx.in.overrides.end());
  const int code = flowtrain::runner::relaunch_as_ranks(ctx.in.nproc, args);
  if (code != 0) {
    throw Error(command + " on " + std::to_string(ctx.in.nproc) + " ranks failed (exit code " +
                std::to_string(code) + ")");
  }
}

}  // namespace foodtag
