#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <optional>
#include <sstream>

#include "apps/foodtag/commands/command.hpp"
#include "apps/foodtag/compare.hpp"
#include "apps/foodtag/profile.hpp"
#include "graph/atomic_file.hpp"
#include "graph/csv.hpp"
#include "graph/error.hpp"
#include "graph/report_io.hpp"
#include "runner/run_phases.hpp"

namespace foodtag {

using flowtrain::Error;

namespace {

using Point = std::vector<std::pair<std::string, std::string>>;

// The combinations of a sweep grid "student.lr=0.001,0.002; student.temperature=2,4": each a
// list of (key, value), the first key varying slowest. A key is distill's STAGE.PARAM, a whole
// override key (phases.PHASE.stages.STAGE.params.PARAM), `seed`, `recipe` or `teacher_recipe`.
std::vector<Point> sweep_points(const std::string& grid) {
  std::vector<Point> points = {{}};
  std::stringstream axes(grid);
  for (std::string axis; std::getline(axes, axis, ';');) {
    axis.erase(0, axis.find_first_not_of(" "));
    axis.erase(axis.find_last_not_of(" ") + 1);
    if (axis.empty()) continue;
    const std::size_t eq = axis.find('=');
    const std::string key = axis.substr(0, eq);
    if (eq == std::string::npos || (key.find('.') == std::string::npos && key != "seed" &&
                                    key != "recipe" && key != "teacher_recipe")) {
      throw Error("sweep.grid: '" + axis +
                  "' is not STAGE.PARAM=v1,v2,..., phases.PHASE.stages.STAGE.params.PARAM=v1,..., "
                  "seed=v1,v2,..., recipe=r1,r2,... or teacher_recipe=r1,r2,...");
    }
    std::vector<Point> next;
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

// The overrides that set a sweep point: STAGE.PARAM's of phase distill (and so of baseline,
// which extends it), a phases.* key as it is, student.recipe for `recipe`, teacher.recipe for
// `teacher_recipe`, and for `seed` the seed of each stage of distill that has one (the order of
// the photos, the views, the mixing and the student's initial weights).
std::vector<std::string> sweep_overrides(flowtrain::RunConfig& config, const Point& point) {
  std::vector<std::string> overrides;
  const std::string prefix = "phases.distill.stages.";
  const flowtrain::PipelineConfig* distill = find_phase(config, "distill");
  for (const auto& [key, value] : point) {
    if (key == "recipe") {
      overrides.push_back("student.recipe=" + value);
    } else if (key == "teacher_recipe") {
      overrides.push_back("teacher.recipe=" + value);
    } else if (key.rfind("phases.", 0) == 0) {
      overrides.push_back(key + "=" + value);
    } else if (key != "seed") {
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

// What a training phase learns from: its stages and every param, but where it writes its
// checkpoints and how often. Two runs of equal keys train the same weights.
std::string training_key(const flowtrain::PipelineConfig& phase) {
  std::string key;
  for (const flowtrain::StageConfig& stage : phase.stages) {
    key += stage.name + ": " + stage.type + "\n";
    for (const auto& [name, value] : stage.params.values()) {
      if (name == "checkpoint_dir" || name == "checkpoint_every" || name == "snapshot_every" ||
          name == "resume") {
        continue;
      }
      key += "  " + name + ": " + value_text(value) + "\n";
    }
  }
  return key;
}

// Whether `dir` holds a model trained under `key` since the model files `phase` reads (its
// teacher, an init) were written: its key.txt says that key and is newer than each of them.
bool trained_under(const fs::path& dir, const std::string& key,
                   const flowtrain::PipelineConfig& phase) {
  const fs::path key_file = dir / "key.txt";
  std::ifstream in(key_file, std::ios::binary);
  if (!in || std::string(std::istreambuf_iterator<char>(in), {}) != key) return false;
  std::error_code ec;
  const fs::file_time_type trained = fs::last_write_time(key_file, ec);
  for (const flowtrain::StageConfig& stage : phase.stages) {
    for (const char* param : {"model", "init"}) {
      const auto it = stage.params.values().find(param);
      const std::string* file =
          it == stage.params.values().end() ? nullptr : std::get_if<std::string>(&it->second);
      if (file && fs::is_regular_file(*file, ec) && fs::last_write_time(*file, ec) > trained) {
        return false;
      }
    }
  }
  return true;
}

// One model a sweep trains and validates: its held-out predictions and the reports of its
// training and validation phases.
struct Trained {
  Predictions predictions;
  flowtrain::RunReport training, eval;
};

// Trains one model into `dir` with the phases of `command` and then `eval_phase` under
// `overrides`, which point its checkpoints and predictions there; or keeps what `dir` holds when
// it was trained under the same settings and teacher (a sweep run again, or one interrupted,
// trains only what it has not).
Trained train_or_keep(const Context& ctx,
                      const std::string& command,
                      const std::string& eval_phase,
                      const std::vector<std::string>& overrides,
                      const fs::path& dir,
                      const std::string& what) {
  PhasePlan plan = check_phases(ctx, command, overrides);
  if (plan.phases.back() != eval_phase) plan.phases.push_back(eval_phase);
  const std::string training_phase = plan.phases[plan.phases.size() - 2];
  const flowtrain::PipelineConfig& training = *find_phase(plan.config, training_phase);
  const std::string key = training_key(training) + training_key(*find_phase(plan.config, eval_phase));
  const fs::path predictions = dir / "predictions.csv";
  const fs::path training_report = dir / (training_phase + ".yaml");
  const fs::path eval_report = dir / (eval_phase + ".yaml");
  if (trained_under(dir, key, training) &&
      fs::exists(predictions) && fs::exists(training_report) && fs::exists(eval_report)) {
    std::cout << "== foodtag sweep " << what << " (done before, kept)\n" << std::flush;
    return {read_predictions(what, predictions.string()),
            flowtrain::read_report_file(training_report.string()),
            flowtrain::read_report_file(eval_report.string())};
  }
  std::cout << "== foodtag sweep " << what << "\n" << std::flush;
  std::error_code ec;
  fs::remove_all(dir, ec);  // a fresh model, not a resumed one
  flowtrain::runner::PhaseHooks hooks;
  hooks.progress = progress_line;
  const flowtrain::runner::PhasesOutcome outcome = flowtrain::runner::run_phases(
      plan.config,
      {.config_path = ctx.in.config_path,
       .overrides = overrides,
       .progress_interval_s = ctx.section("output").get_float("progress_interval_s"),
       .phases = plan.phases},
      hooks);
  if (outcome.stopped) throw Error("stopped by " + *outcome.stopped);
  Trained out{read_predictions(what, predictions.string()),
              outcome.reports[outcome.reports.size() - 2], outcome.reports.back()};
  flowtrain::write_report_file(out.training, training_report.string());
  flowtrain::write_report_file(out.eval, eval_report.string());
  flowtrain::write_file_atomically((dir / "key.txt").string(), key);  // last: it is complete
  return out;
}

// The overrides that train phase `training`'s train_step into `dir` (no snapshots) and have
// phase `eval` validate that model, its predictions in `dir`.
std::vector<std::string> into(flowtrain::RunConfig& config,
                              const std::string& training,
                              const std::string& eval,
                              const fs::path& dir) {
  const flowtrain::StageConfig* step = find_stage(*find_phase(config, training), "train_step");
  return {param_override(training, step->name, "checkpoint_dir", dir.string()),
          param_override(training, step->name, "snapshot_every", "0"),
          param_override(eval, "evaluate", "model", (dir / "final.pt").string()),
          param_override(eval, "evaluate", "predictions", (dir / "predictions.csv").string())};
}

// The folder of a model the points of an equal `key` share: DIR/sweep/WHAT-<hash of key>/.
fs::path shared_dir(const Context& ctx, const std::string& what, const std::string& key) {
  char hash[24];
  std::snprintf(hash, sizeof hash, "-%016zx", std::hash<std::string>{}(key));
  return ctx.out_dir / "sweep" / (what + hash);
}

// `a` followed by `b`.
std::vector<std::string> plus(std::vector<std::string> a, std::vector<std::string> b) {
  a.insert(a.end(), std::make_move_iterator(b.begin()), std::make_move_iterator(b.end()));
  return a;
}

// What a sweep point trains on one context's data (the run's, or a fold's):
// - a student, into DIR/sweep/N/, validated with student_eval;
// - the same student on the labels alone, trained as long with the same data, views and mixing
//   (phase baseline under the point's overrides), into DIR/sweep/labels-<key>/, which every
//   point of an equal baseline shares;
// - for a point that changes how phase teacher trains (teacher_recipe, phases.teacher.*), a
//   teacher of its own, into DIR/sweep/teacher-<key>/ (shared the same way), validated with
//   teacher_eval. The other points learn from the run's teacher, whose top-1 eval's
//   predictions give when they are of that teacher.
struct PointRun {
  Trained student, labels;
  std::optional<Predictions> teacher;
  double teacher_wall_s = 0;  // training its own teacher; 0 for the run's
};

// The point's own teacher, trained (or kept) into `run`, and the overrides that have its
// student learn from it, through a teacher cache of its own beside it; none for a point of the
// run's teacher, or of the user's (teacher.model).
std::vector<std::string> own_point_teacher(const Context& ctx,
                                           flowtrain::RunConfig& as_run,
                                           flowtrain::RunConfig& config,
                                           const std::vector<std::string>& overrides,
                                           const std::string& what,
                                           PointRun& run) {
  const flowtrain::PipelineConfig* teacher = find_phase(config, "teacher");
  if (!teacher || !own_teacher(config.sections).empty() ||
      training_key(*teacher) == training_key(*find_phase(as_run, "teacher"))) {
    return {};
  }
  const fs::path dir = shared_dir(ctx, "teacher", training_key(*teacher));
  Trained trained = train_or_keep(ctx, "train-teacher", "teacher_eval",
                                  plus(overrides, into(config, "teacher", "teacher_eval", dir)),
                                  dir, what + ", its teacher");
  run.teacher = std::move(trained.predictions);
  run.teacher_wall_s = trained.training.wall_s;
  // The teacher is trained: its recipe has done its work (and teacher.model refuses one).
  std::vector<std::string> learn = {"teacher.model=" + (dir / "final.pt").string(),
                                    "teacher.recipe="};
  if (const auto* cache = find_stage(*find_phase(config, "distill"), "teacher_cache")) {
    learn.push_back(
        param_override("distill", cache->name, "path", (dir / "teacher-cache.ftc").string()));
  }
  return learn;
}

// Eval's predictions of the teacher the point's students learn from, when it wrote them after
// that teacher was trained.
std::optional<Predictions> teacher_predictions(const Context& ctx,
                                               const flowtrain::RunConfig& config) {
  const fs::path predictions = ctx.out_dir / "predictions" / "teacher.csv";
  const std::string own = own_teacher(config.sections);
  const fs::path model = own.empty() ? ctx.teacher_checkpoint() : fs::path(own);
  std::error_code written_ec, trained_ec;
  const auto written = fs::last_write_time(predictions, written_ec);
  const auto trained = fs::last_write_time(model, trained_ec);
  if (written_ec || trained_ec || written < trained) return std::nullopt;
  return read_predictions("teacher", predictions.string());
}

PointRun point_run(const Context& ctx, const Point& point, std::size_t index, const std::string& what) {
  std::vector<std::string> overrides = ctx.in.overrides;
  flowtrain::RunConfig as_run = load_phases(ctx.in.config_path, overrides);
  overrides = plus(std::move(overrides), sweep_overrides(as_run, point));
  flowtrain::RunConfig config = load_phases(ctx.in.config_path, overrides);

  PointRun run;
  std::vector<std::string> learn = own_point_teacher(ctx, as_run, config, overrides, what, run);
  if (learn.empty()) {
    run.teacher = teacher_predictions(ctx, config);
  } else {
    overrides = plus(std::move(overrides), std::move(learn));
    config = load_phases(ctx.in.config_path, overrides);
  }

  const fs::path dir = ctx.out_dir / "sweep" / std::to_string(index + 1);
  run.student = train_or_keep(ctx, "sweep", "student_eval",
                              plus(overrides, into(config, "distill", "student_eval", dir)), dir,
                              what + ", the student");

  const flowtrain::PipelineConfig* baseline = find_phase(config, "baseline");
  if (!baseline || !find_phase(config, "baseline_eval")) {
    throw Error(ctx.in.config_path +
                ": foodtag sweep compares each student with phase baseline (the student on labels "
                "alone), validated by phase baseline_eval; the config lacks one of them");
  }
  const fs::path labels_dir = shared_dir(ctx, "labels", training_key(*baseline));
  run.labels = train_or_keep(ctx, "baseline", "baseline_eval",
                             plus(overrides, into(config, "baseline", "baseline_eval", labels_dir)),
                             labels_dir, what + ", the student on labels alone");
  return run;
}

// A point's value as the table and the progress lines show it: "" for none (a recipe as written).
std::string shown(const std::string& value) { return value.empty() ? "\"\"" : value; }

std::string number(const char* format, double value) {
  char text[64];
  std::snprintf(text, sizeof text, format, value);
  return text;
}

}  // namespace

int sweep_command(const Context& ctx) {
  const auto points = sweep_points(ctx.section("sweep").get_string("grid"));
  // On folds (--folds K, after `foodtag cv --folds K`): each point trains a student per fold,
  // and its top-1 is over every held-out photo.
  const std::vector<Context> contexts =
      ctx.in.folds > 0 ? cv_folds(ctx, ctx.in.folds) : std::vector<Context>{ctx};
  const fs::path table_dir = ctx.in.folds > 0 ? contexts.front().out_dir.parent_path() : ctx.out_dir;
  std::vector<std::string> header = {"run"};
  for (const auto& [key, value] : points.front()) header.push_back(key);
  for (const char* column :
       {"top1", "low", "high", "labels_top1", "only_student", "only_labels", "p", "mae", "minutes",
        "labels_minutes", "teacher_hit_rate", "photos", "teacher_top1", "teacher_minutes"}) {
    header.push_back(column);
  }
  std::string csv = flowtrain::csv_line(header);
  // Each key's column as wide as its widest value.
  std::vector<std::size_t> widths;
  for (std::size_t k = 0; k < points.front().size(); ++k) {
    widths.push_back(points.front()[k].first.size());
    for (const Point& point : points)
      widths[k] = std::max(widths[k], shown(point[k].second).size());
  }
  std::string table = "  run";
  for (std::size_t k = 0; k < widths.size(); ++k) {
    const std::string& key = points.front()[k].first;
    table += "  " + std::string(widths[k] - key.size(), ' ') + key;
  }
  char row[256];
  const char* format = "  %-20s  %12s  %22s  %10s  %10s  %6s  %18s  %6s  %7s\n";
  std::snprintf(row, sizeof row, format, "top-1 (95% interval)", "labels alone",
                "right only: it / labels", "McNemar p", "energy MAE", "time", "teacher cache hits",
                "photos", "teacher");
  table += row;
  for (std::size_t i = 0; i < points.size(); ++i) {
    Predictions student{.name = "student"}, labels{.name = "labels"};
    std::optional<Predictions> teacher = Predictions{.name = "teacher"};
    double mae = 0, wall_s = 0, labels_wall_s = 0, teacher_wall_s = 0, hits = 0, misses = 0;
    for (std::size_t f = 0; f < contexts.size(); ++f) {
      std::string what = std::to_string(i + 1) + "/" + std::to_string(points.size()) + ":";
      for (const auto& [key, value] : points[i]) what += " " + key + "=" + shown(value);
      if (ctx.in.folds > 0) {
        what += ", fold " + std::to_string(f + 1) + "/" + std::to_string(contexts.size());
      }
      const PointRun run = point_run(contexts[f], points[i], i, what);
      for (auto [all, one] : {std::pair{&student, &run.student}, std::pair{&labels, &run.labels}}) {
        all->paths.insert(all->paths.end(), one->predictions.paths.begin(),
                          one->predictions.paths.end());
        all->right.insert(all->right.end(), one->predictions.right.begin(),
                          one->predictions.right.end());
      }
      if (teacher && run.teacher) {
        teacher->right.insert(teacher->right.end(), run.teacher->right.begin(),
                              run.teacher->right.end());
      } else {
        teacher.reset();  // a fold without the teacher's predictions: its top-1 is unknown
      }
      teacher_wall_s += run.teacher_wall_s;
      mae += stage_result(run.student.eval, "mae").value_or(0) *
             static_cast<double>(run.student.predictions.right.size());
      wall_s += run.student.training.wall_s;
      labels_wall_s += run.labels.training.wall_s;
      hits += stage_result(run.student.training, "hits").value_or(0);
      misses += stage_result(run.student.training, "misses").value_or(0);
    }
    const std::uint64_t photos = student.right.size();
    const auto right = [](const Predictions& p) {
      return static_cast<std::uint64_t>(std::count(p.right.begin(), p.right.end(), true));
    };
    const double n = static_cast<double>(std::max<std::uint64_t>(photos, 1));
    const auto [low, high] = wilson_interval(right(student), photos);
    const PairedComparison c = compare(student, labels);
    const double lookups = hits + misses;
    const double hit_rate = lookups > 0 ? hits / lookups : 0;
    std::vector<std::string> fields = {std::to_string(i + 1)};
    table += "  " + std::to_string(i + 1);
    for (std::size_t k = 0; k < widths.size(); ++k) {
      fields.push_back(points[i][k].second);
      const std::string value = shown(points[i][k].second);
      table += "  " + std::string(widths[k] - value.size(), ' ') + value;
    }
    for (const double v : {right(student) / n, low, high, right(labels) / n}) {
      fields.push_back(number("%.4f", v));
    }
    fields.push_back(std::to_string(c.only_a));
    fields.push_back(std::to_string(c.only_b));
    fields.push_back(number("%.3g", c.p_value));
    fields.push_back(number("%.2f", mae / n));
    fields.push_back(number("%.2f", wall_s / 60));
    fields.push_back(number("%.2f", labels_wall_s / 60));
    fields.push_back(number("%.3f", hit_rate));
    fields.push_back(std::to_string(photos));
    std::optional<double> teacher_top1;
    if (teacher) teacher_top1 = right(*teacher) / std::max<double>(teacher->right.size(), 1);
    fields.push_back(teacher_top1 ? number("%.4f", *teacher_top1) : "");
    fields.push_back(number("%.2f", teacher_wall_s / 60));
    csv += flowtrain::csv_line(fields);
    const std::string top1 = number("%.1f%%", 100 * right(student) / n) + " (" +
                             number("%.1f", 100 * low) + "-" + number("%.1f%%", 100 * high) + ")";
    const std::string only = std::to_string(c.only_a) + " / " + std::to_string(c.only_b);
    std::snprintf(row, sizeof row, format, top1.c_str(),
                  number("%.1f%%", 100 * right(labels) / n).c_str(), only.c_str(),
                  number("%.2g", c.p_value).c_str(), number("%.1f", mae / n).c_str(),
                  duration_text(wall_s).c_str(), number("%.0f%%", 100 * hit_rate).c_str(),
                  std::to_string(photos).c_str(),
                  teacher_top1 ? number("%.1f%%", 100 * *teacher_top1).c_str() : "-");
    table += row;
  }
  flowtrain::write_file_atomically((table_dir / "sweep.csv").string(), csv);
  std::cout << "sweep (" << (table_dir / "sweep.csv").string() << "):\n" << table;
  return 0;
}

}  // namespace foodtag
