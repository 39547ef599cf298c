#include <algorithm>
#include <optional>
#include <utility>

#include "apps/foodtag/commands/command.hpp"
#include "graph/error.hpp"
#include "stages/train/models/model.hpp"

namespace foodtag {

using flowtrain::Error;

namespace {

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

// SECTION.recipe (student.recipe, teacher.recipe) as the overrides of the train_step of `phase`
// it stands for (none when unset). They come before the command line's, which win over them.
std::vector<std::string> recipe_overrides(flowtrain::RunConfig& config,
                                          const std::string& section,
                                          const std::string& phase_name,
                                          const std::vector<Recipe>& known) {
  const std::string name = config.sections.at(section).get_string("recipe");
  flowtrain::PipelineConfig* phase = find_phase(config, phase_name);
  if (name.empty() || !phase) return {};
  if (section == "teacher" && !own_teacher(config.sections).empty()) {
    throw Error("teacher.recipe '" + name +
                "' says how phase teacher trains the teacher, but "
                "teacher.model names a teacher of your own, which it does not train: unset one");
  }
  const flowtrain::StageConfig* step = find_stage(*phase, "train_step");
  if (!step) {
    throw Error(section + ".recipe: phase " + phase_name + " has no train_step stage to take it");
  }
  const auto recipe =
      std::find_if(known.begin(), known.end(), [&](const Recipe& r) { return r.name == name; });
  std::vector<std::string> out;
  for (const auto& [param, value] : recipe->params) {
    out.push_back(param_override(phase_name, step->name, param, value));
  }
  return out;
}

}  // namespace

const std::vector<Recipe>& recipes() {
  static const std::vector<Recipe> kRecipes = {
      {"deit_hard",
       {{"distillation_token", "true"}, {"distillation", "hard"}, {"alpha", "0.5"}},
       "DeiT's hard distillation (Touvron et al. 2021): a distillation token whose head learns "
       "the teacher's top class, while the class token learns the labels; predictions average "
       "the two heads"},
      {"hinton",
       {{"distillation_token", "false"}, {"distillation", "soft"}, {"alpha", "0.5"},
        {"temperature", "2"}},
       "knowledge distillation (Hinton et al. 2015): one head learns half from the labels, half "
       "from the teacher's outputs softened at temperature 2"},
      {"function_matching",
       {{"distillation_token", "false"}, {"distillation", "soft"}, {"alpha", "0"},
        {"temperature", "1"}},
       "function matching (Beyer et al. 2022, \"A good teacher is patient and consistent\"): the "
       "teacher's outputs only, at temperature 1, on the same mixed view the student sees (the "
       "phase's mixup stage); no label loss for the classes"},
  };
  return kRecipes;
}

const std::vector<Recipe>& teacher_recipes() {
  static const std::vector<Recipe> kRecipes = {
      {"no_smoothing",
       {{"label_smoothing", "0"}},
       "the teacher learns its labels without label smoothing (Müller, Kornblith and Hinton "
       "2019, \"When does label smoothing help?\": a teacher trained with label smoothing "
       "teaches worse, as smoothing erases from its outputs how alike the classes are)"},
      {"ema",
       {{"ema_decay", "0.99"}},
       "the teacher's averaged weights teach (an exponential moving average of its weights; "
       "Tarvainen and Valpola 2017, \"Mean teachers are better role models\": the average of "
       "a model's recent weights makes a better target than its latest ones)"},
  };
  return kRecipes;
}

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

flowtrain::RunConfig load_phases(const std::string& config_path,
                                 std::vector<std::string> overrides) {
  flowtrain::RunConfig config = flowtrain::load_run_config(config_path, overrides, sections());
  std::vector<std::string> derived = recipe_overrides(config, "student", "distill", recipes());
  for (std::string& o : recipe_overrides(config, "teacher", "teacher", teacher_recipes())) {
    derived.push_back(std::move(o));
  }
  const std::vector<std::string> student = student_overrides(config, config_path, overrides);
  if (derived.empty() && student.empty()) return config;
  derived.insert(derived.end(), overrides.begin(), overrides.end());
  derived.insert(derived.end(), student.begin(), student.end());
  return flowtrain::load_run_config(config_path, derived, sections());
}

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

PhasePlan check_phases(const Context& ctx,
                       const std::string& command,
                       const std::vector<std::string>& overrides) {
  check_prepared(ctx);
  check_output_dir(ctx);
  PhasePlan plan{load_phases(ctx.in.config_path, overrides), {}};
  plan.phases = derive_phases(plan.config, command_phases().at(command));
  const flowtrain::RunConfig& config = plan.config;
  std::vector<std::string>& names = plan.phases;
  // A model a phase takes from an earlier command that has not run yet: say which command writes
  // it. A stage pointed at the user's own model (a TorchScript teacher) needs neither. `eval`
  // evaluates the models there are, and says which it left out.
  std::optional<std::pair<fs::path, std::string>> first_missing;
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
        if (fs::path(*path).lexically_normal() != model.lexically_normal()) continue;
        if (command != "eval") check_model(model, writer);
        if (fs::exists(model) || std::find(names.begin(), names.end(), phase.name) == names.end()) {
          continue;
        }
        if (!first_missing) first_missing = {model, writer};
        names.erase(std::find(names.begin(), names.end(), phase.name));
        plan.skipped.push_back("eval: skipped phase " + phase.name + ": no model at " +
                               model.string() + " (`foodtag " + writer + "` writes it)");
      }
    }
  }
  if (names.empty() && first_missing) check_model(first_missing->first, first_missing->second);
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

}  // namespace foodtag
