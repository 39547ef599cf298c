#pragma once

// What the foodtag subcommands share, and their entry points: apps/foodtag/commands.cpp
// dispatches a command line to one of them, each in its own file here.
//
//   context.cpp   the app's config sections, the run's Context, the checks before a command
//   plan.cpp      the phases a command runs, and what foodtag derives in them
//   phases.cpp    train-teacher, distill, baseline, eval: the phases run in turn
//   prepare.cpp, export.cpp, report.cpp, sweep.cpp, predict.cpp, config.cpp, run.cpp: one
//                 command each

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "apps/foodtag/commands.hpp"
#include "apps/foodtag/html_report.hpp"
#include "graph/config.hpp"
#include "graph/report.hpp"

namespace foodtag {

namespace fs = std::filesystem;

// context.cpp

/// The app's own keys, beside `phases:` in the config: one source for validation, `foodtag keys`
/// and the README's reference.
const std::vector<flowtrain::ConfigSection>& sections();

/// What every command knows about its run.
struct Context {
  Invocation in;
  std::map<std::string, flowtrain::Params> sections;
  fs::path data_dir, out_dir;

  const flowtrain::Params& section(const std::string& key) const { return sections.at(key); }
  fs::path teacher_checkpoint() const { return out_dir / "teacher" / "final.pt"; }
  fs::path student_checkpoint() const { return out_dir / "student" / "final.pt"; }
  fs::path baseline_checkpoint() const { return out_dir / "baseline" / "final.pt"; }
  fs::path profile(const std::string& phase) const {
    return out_dir / "profile" / (phase + ".yaml");
  }
};

/// The command line's context: its sections read (not yet its phases).
Context load_context(Invocation in);

/// Creates the run folder and proves it writable, before any work that would be lost.
void check_output_dir(const Context& ctx);

/// The non-empty lines of a text file (labels.txt); throws Error if it cannot be read.
std::vector<std::string> read_lines(const fs::path& path);

/// Throws Error, saying to run `foodtag prepare`, if the data folder lacks its manifests.
void check_prepared(const Context& ctx);

/// Throws Error, saying which command writes it, if there is no model at `path`.
void check_model(const fs::path& path, const std::string& command);

/// teacher.model: the user's own TorchScript teacher, absolute (a path given on the command line
/// is relative to the shell's folder), or "" when phase teacher trains one.
std::string own_teacher(const std::map<std::string, flowtrain::Params>& sections);

/// train-teacher with teacher.model set has nothing to train: says so in one line.
bool nothing_to_train(const Context& ctx, const std::string& command);

/// The value of the result `name` of any stage of `report`, if one has it.
std::optional<double> stage_result(const flowtrain::RunReport& report, const std::string& name);

/// The override that sets param `param` of stage `stage` in phase `phase`:
/// "phases.PHASE.stages.STAGE.params.PARAM=VALUE".
std::string param_override(const std::string& phase, const std::string& stage,
                           const std::string& param, const std::string& value);

/// The first stage of `type` in `phase`, or nullptr.
flowtrain::StageConfig* find_stage(flowtrain::PipelineConfig& phase, const std::string& type);

/// The phase named `name`, or nullptr.
flowtrain::PipelineConfig* find_phase(flowtrain::RunConfig& config, const std::string& name);

/// The middle value (the upper one of an even count); 0 for none.
double median(std::vector<double> values);

// plan.cpp

/// The phases each command runs, in order.
const std::map<std::string, std::vector<std::string>>& command_phases();

/// A recipe: the params of a train_step it sets (student.recipe: phase distill's student;
/// teacher.recipe: phase teacher's).
struct Recipe {
  std::string name;
  std::vector<std::pair<std::string, std::string>> params;
  std::string doc;  // what it is, and its source
};

/// foodtag's distillation recipes (student.recipe), in the order `foodtag keys` lists them.
const std::vector<Recipe>& recipes();

/// foodtag's teacher recipes (teacher.recipe), in the order `foodtag keys` lists them.
const std::vector<Recipe>& teacher_recipes();

/// The config the phases run: the file with `overrides` and those student.model,
/// student.recipe and teacher.recipe stand for (a recipe's before `overrides`, which win over it).
flowtrain::RunConfig load_phases(const std::string& config_path,
                                 std::vector<std::string> overrides);

/// What foodtag derives that the config does not say (baseline and precompute say in the config
/// what they take from distill, with `extends`; student.model is overrides, load_phases):
/// - teacher.model, the user's own teacher, replaces the trained teacher's checkpoint wherever a
///   stage reads it: a rule over every stage whose `model` is that file, which only exists
///   after the config's `${output.dir}` is known;
/// - a teacher_cache keys its entries by the teacher its phase's teacher_infer runs (its model
///   and autocast, after teacher.model), so the cache never serves another teacher's outputs;
/// - precompute runs views_per_image epochs, one per view, and none when it is 0 (its source's
///   `epochs` cannot be 0, and a phase is not run by a key of the config).
/// Returns which of `phases` run.
std::vector<std::string> derive_phases(flowtrain::RunConfig& config,
                                       std::vector<std::string> phases);

/// A phase command's config, with what foodtag derives (derive_phases), and the phases to run.
struct PhasePlan {
  flowtrain::RunConfig config;
  std::vector<std::string> phases;
  /// `eval`'s phases left out for a model no command has written yet, each as a line saying so.
  std::vector<std::string> skipped;
};

/// What a phase command needs before it starts: the models of earlier commands, the data, a
/// writable run folder, a valid config. `overrides`: the command line's, and the caller's own.
PhasePlan check_phases(const Context& ctx,
                       const std::string& command,
                       const std::vector<std::string>& overrides);

// phases.cpp

/// foodtag's progress line of a phase (ProgressLine: epoch, step, rate, ETA, loss), as
/// flowtrain::runner::PhaseHooks::progress takes it.
std::function<std::string(const flowtrain::Progress&)> progress_line(
    const flowtrain::PipelineConfig& phase);

/// Runs the named phases of the config in turn (runner/run_phases.hpp: a progress line while
/// each runs, its profiler report after; as a rank of a job when the launcher's environment says
/// so). foodtag adds its own progress line (epochs), the step split after each report, the
/// report saved under profile/ for `foodtag report`, traces, and the validation of snapshots.
void run_phases(const Context& ctx, const std::string& command);

/// Runs `command`'s phases as --nproc local ranks of a job: this program again, without --nproc.
void launch_phases(const Context& ctx, const std::string& command);

// config.cpp

/// A param's value as YAML writes it: a float always with a point or an exponent (so 1.0 never
/// reads as the whole number 1), in the shortest form that reads back as the same double.
std::string value_text(const flowtrain::ParamValue& value);

// One file each: prepare, export, report, sweep, predict, config, run.

/// `foodtag prepare`: the photos and tables fetched (or copied from data.from), the manifests.
int prepare_command(const Context& ctx);
/// Exports both models as TorchScript, then measures their inference speed side by side
/// (alternating, medians) and writes models.yaml for the report.
int export_command(const Context& ctx);
/// `foodtag report`: what the run folder holds (the phases' profiles, steps.csv curves,
/// models.yaml, config.yaml) gathered into report.html.
int report_command(const Context& ctx);
/// What needs no model: always answering the training set's most frequent food groups (top-1
/// and top-5) and its median energy, on the validation photos. None without the manifests.
std::optional<ModelFacts> trivial_baseline(const Context& ctx);
/// The contexts of `folds` folds of the prepared photos (apps/foodtag/folds.hpp), each with
/// its data folder (train.csv and val.csv, absolute paths; labels) and run folder under
/// OUTPUT/cv/<folds>-folds-seed-<data.seed>/fold-<N>/, written now; and folds.csv there.
std::vector<Context> cv_folds(const Context& ctx, int folds);
/// `foodtag cv --folds K`: each fold's train-teacher, distill, baseline and eval (those done
/// before are kept), then every model's top-1 over all held-out photos with its interval, the
/// folds' spread, the energy errors and the student against the baseline and the teacher photo
/// by photo; printed and written (cv.txt, cv.csv).
int cv_command(const Context& ctx);
/// Trains one student per point of sweep.grid with distill's config (its checkpoints under
/// OUTPUT/sweep/N/), validates each with student_eval, and prints and saves (OUTPUT/sweep.csv)
/// a table of their validation accuracy and time. With the teacher cache of `distill` filled,
/// no student here runs the teacher.
int sweep_command(const Context& ctx);
/// `foodtag predict`: the top food groups and the energy of each photo.
int predict_command(const Context& ctx);
/// Each phase as foodtag runs it (after the overrides, `extends` and what foodtag derives): its
/// run options, then each stage with its options and every param, defaults included. A phase that
/// no command runs with this config (precompute at views_per_image 0) says so.
int config_command(const Context& ctx);
/// `foodtag run`: prepare, train-teacher, distill, baseline, eval, export and report in turn
/// (the phase commands as --nproc ranks when asked), then the time each took.
int run_all_command(const Context& ctx);

}  // namespace foodtag
