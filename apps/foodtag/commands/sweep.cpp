#include <cstdio>
#include <iostream>
#include <sstream>

#include "apps/foodtag/commands/command.hpp"
#include "apps/foodtag/profile.hpp"
#include "runner/run_phases.hpp"
#include "graph/atomic_file.hpp"
#include "graph/csv.hpp"
#include "graph/error.hpp"

namespace foodtag {

using flowtrain::Error;

namespace {

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

// One student of a sweep point trained on one context's data (the run's, or a fold's) into
// DIR/sweep/N/ and validated with student_eval.
struct SweepRun {
  double top1 = 0, mae = 0, images = 0, wall_s = 0, hits = 0, misses = 0;
};

SweepRun sweep_run(const Context& ctx,
                   flowtrain::RunConfig& config,
                   const std::vector<std::pair<std::string, std::string>>& point,
                   std::size_t index) {
  const fs::path dir = ctx.out_dir / "sweep" / std::to_string(index + 1);
  std::vector<std::string> overrides = ctx.in.overrides;
  for (std::string& o : sweep_overrides(config, point)) overrides.push_back(std::move(o));
  overrides.push_back("phases.distill.stages.student.params.checkpoint_dir=" + dir.string());
  overrides.push_back("phases.distill.stages.student.params.snapshot_every=0");
  overrides.push_back("phases.student_eval.stages.evaluate.params.model=" +
                      (dir / "final.pt").string());
  overrides.push_back("phases.student_eval.stages.evaluate.params.predictions=" +
                      (dir / "predictions.csv").string());  // not the run's student's
  std::error_code ec;
  fs::remove_all(dir, ec);  // a fresh student, not a resumed one
  PhasePlan plan = check_phases(ctx, "sweep", overrides);
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
  const flowtrain::RunReport& distill = outcome.reports[outcome.reports.size() - 2];
  const flowtrain::RunReport& eval = outcome.reports.back();
  return {.top1 = stage_result(eval, "top1").value_or(-1),
          .mae = stage_result(eval, "mae").value_or(-1),
          .images = stage_result(eval, "images").value_or(0),
          .wall_s = distill.wall_s,
          .hits = stage_result(distill, "hits").value_or(0),
          .misses = stage_result(distill, "misses").value_or(0)};
}

}  // namespace

int sweep_command(const Context& ctx) {
  const auto points = sweep_points(ctx.section("sweep").get_string("grid"));
  flowtrain::RunConfig config =
      flowtrain::load_run_config(ctx.in.config_path, ctx.in.overrides, sections());
  // On folds (--folds K, after `foodtag cv --folds K`): each point trains a student per fold,
  // and its top-1 is over every held-out photo.
  const std::vector<Context> contexts =
      ctx.in.folds > 0 ? cv_folds(ctx, ctx.in.folds) : std::vector<Context>{ctx};
  const fs::path table_dir = ctx.in.folds > 0 ? contexts.front().out_dir.parent_path() : ctx.out_dir;
  std::vector<std::string> keys;
  for (const auto& [key, value] : points.front()) keys.push_back(key);
  std::vector<std::string> header = {"run"};
  header.insert(header.end(), keys.begin(), keys.end());
  for (const char* column : {"top1", "mae", "minutes", "teacher_hit_rate", "photos"}) {
    header.push_back(column);
  }
  std::string csv = flowtrain::csv_line(header);
  std::string table = "  run";
  for (const std::string& key : keys) table += "  " + key;
  table += "  val top-1  energy MAE  time  teacher cache hits  photos\n";
  for (std::size_t i = 0; i < points.size(); ++i) {
    SweepRun pooled;  // photo-weighted over the folds
    for (std::size_t f = 0; f < contexts.size(); ++f) {
      std::cout << "== foodtag sweep " << (i + 1) << "/" << points.size() << ":";
      for (const auto& [key, value] : points[i]) std::cout << " " << key << "=" << value;
      if (ctx.in.folds > 0) std::cout << ", fold " << (f + 1) << "/" << contexts.size();
      std::cout << "\n" << std::flush;
      const SweepRun run = sweep_run(contexts[f], config, points[i], i);
      pooled.top1 += run.top1 * run.images;
      pooled.mae += run.mae * run.images;
      pooled.images += run.images;
      pooled.wall_s += run.wall_s;
      pooled.hits += run.hits;
      pooled.misses += run.misses;
    }
    const double top1 = pooled.images > 0 ? pooled.top1 / pooled.images : -1;
    const double mae = pooled.images > 0 ? pooled.mae / pooled.images : -1;
    const double lookups = pooled.hits + pooled.misses;
    const double hit_rate = lookups > 0 ? pooled.hits / lookups : 0;
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
    fields.push_back(number("%.4f", top1));
    fields.push_back(number("%.2f", mae));
    fields.push_back(number("%.2f", pooled.wall_s / 60));
    fields.push_back(number("%.3f", hit_rate));
    fields.push_back(number("%.0f", pooled.images));
    csv += flowtrain::csv_line(fields);
    std::snprintf(row, sizeof row, "  %8.1f%%  %10.1f  %4s  %17.0f%%  %6.0f\n", 100 * top1, mae,
                  duration_text(pooled.wall_s).c_str(), 100 * hit_rate, pooled.images);
    table += row;
  }
  flowtrain::write_file_atomically((table_dir / "sweep.csv").string(), csv);
  std::cout << "sweep (" << (table_dir / "sweep.csv").string() << "):\n" << table;
  return 0;
}

}  // namespace foodtag
