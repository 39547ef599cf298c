#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <optional>

#include "apps/foodtag/commands/command.hpp"
#include "apps/foodtag/compare.hpp"
#include "apps/foodtag/folds.hpp"
#include "apps/foodtag/profile.hpp"
#include "graph/atomic_file.hpp"
#include "graph/csv.hpp"
#include "graph/error.hpp"
#include "graph/report_io.hpp"

namespace foodtag {

using flowtrain::Error;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string percent(double share) {
  char text[16];
  std::snprintf(text, sizeof text, "%.1f%%", 100 * share);
  return text;
}

// Every prepared photo (train.csv's rows, then val.csv's), its path made absolute: the folds'
// manifests live in the run folder, away from the data.
std::vector<std::vector<std::string>> prepared_rows(const Context& ctx, std::string& header) {
  std::vector<std::vector<std::string>> rows;
  for (const char* name : {"train.csv", "val.csv"}) {
    const fs::path manifest = ctx.data_dir / name;
    std::vector<flowtrain::CsvRow> csv = flowtrain::read_csv_file(manifest.string());
    if (csv.empty()) throw Error(manifest.string() + " is empty: run `foodtag prepare` again");
    header = flowtrain::csv_line(csv.front().fields);
    for (std::size_t r = 1; r < csv.size(); ++r) {
      std::vector<std::string>& fields = csv[r].fields;
      if (fields.size() < 2) {
        throw Error(manifest.string() + ":" + std::to_string(csv[r].line) +
                    ": fewer than 2 fields (path,label)");
      }
      fields[0] = fs::absolute(ctx.data_dir / fields[0]).lexically_normal().string();
      rows.push_back(std::move(fields));
    }
  }
  std::sort(rows.begin(), rows.end());
  return rows;
}

// A fold's phase command already done: its output is there, newer than what it was made from.
bool done(const Context& fold, const std::string& command) {
  std::error_code ec;
  const auto time = [&](const fs::path& path) { return fs::last_write_time(path, ec); };
  if (command == "train-teacher") {
    return !own_teacher(fold.sections).empty() || fs::exists(fold.teacher_checkpoint());
  }
  if (command == "distill") return fs::exists(fold.student_checkpoint());
  if (command == "baseline") return fs::exists(fold.baseline_checkpoint());
  for (const char* model : {"teacher", "student", "baseline"}) {  // eval
    const fs::path predictions = fold.out_dir / "predictions" / (std::string(model) + ".csv");
    const fs::path checkpoint = fold.out_dir / model / "final.pt";
    if (!fs::exists(predictions) || !fs::exists(fold.profile(std::string(model) + "_eval"))) {
      return false;
    }
    if (fs::exists(checkpoint) && time(checkpoint) > time(predictions)) return false;
  }
  return true;
}

// The overrides under which `command` resumes its phases' training steps from their newest
// checkpoint, if one is there: a fold's command interrupted midway goes on where it stopped (the
// train step continues exactly, so the weights are those of an uninterrupted run).
std::vector<std::string> resume_overrides(const Context& fold, const std::string& command) {
  const auto phases = command_phases().find(command);
  if (phases == command_phases().end()) return {};
  flowtrain::RunConfig config = load_phases(fold.in.config_path, fold.in.overrides);
  std::vector<std::string> out;
  for (const std::string& name : phases->second) {
    flowtrain::PipelineConfig* phase = find_phase(config, name);
    if (!phase) continue;
    for (const flowtrain::StageConfig& stage : phase->stages) {
      if (stage.type == "train_step") {
        out.push_back(param_override(name, stage.name, "resume", "true"));
      }
    }
  }
  return out;
}

// The models every fold has held-out predictions of (predictions/NAME.csv): foodtag's three,
// then the others (a PyTorch peer's, a recipe's) by name; `partial` says which some folds lack.
std::vector<std::string> pooled_models(const std::vector<Context>& folds, std::string& partial) {
  std::vector<std::string> names = {"teacher", "student", "baseline"};
  std::map<std::string, std::size_t> others;  // name -> folds holding it
  for (const Context& fold : folds) {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(fold.out_dir / "predictions", ec)) {
      const std::string name = entry.path().stem().string();
      if (entry.path().extension() == ".csv" &&
          std::find(names.begin(), names.begin() + 3, name) == names.begin() + 3) {
        ++others[name];
      }
    }
  }
  for (const auto& [name, count] : others) {
    if (count == folds.size()) {
      names.push_back(name);
    } else {
      partial += name + ": predictions in " + std::to_string(count) + " of " +
                 std::to_string(folds.size()) + " folds, not pooled\n";
    }
  }
  return names;
}

// One model over every fold: its held-out predictions in fold order, and each fold's top-1.
struct Pooled {
  std::string name;
  Predictions all;
  std::vector<double> fold_top1;
  double mae_sum = 0, group_mae_sum = 0;  // photo-weighted sums of the folds' errors
  std::uint64_t right = 0;
};

}  // namespace

std::vector<Context> cv_folds(const Context& ctx, int folds) {
  const std::uint64_t seed = static_cast<std::uint64_t>(ctx.section("data").get_int("seed"));
  std::string header;
  const std::vector<std::vector<std::string>> rows = prepared_rows(ctx, header);
  std::vector<std::string> groups;
  for (const auto& row : rows) groups.push_back(row[1]);
  const std::vector<int> fold_of = assign_folds(groups, folds, seed);
  const fs::path root =
      ctx.out_dir / "cv" / (std::to_string(folds) + "-folds-seed-" + std::to_string(seed));
  std::string assignment = "path,label,fold\n";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    assignment += flowtrain::csv_line({rows[i][0], rows[i][1], std::to_string(fold_of[i] + 1)});
  }
  fs::create_directories(root);
  flowtrain::write_file_atomically((root / "folds.csv").string(), assignment);
  std::vector<Context> contexts;
  for (int f = 0; f < folds; ++f) {
    const fs::path dir = root / ("fold-" + std::to_string(f + 1));
    const fs::path data = dir / "data";
    fs::create_directories(data);
    std::string train = header, val = header;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      (fold_of[i] == f ? val : train) += flowtrain::csv_line(rows[i]);
    }
    flowtrain::write_file_atomically((data / "train.csv").string(), train);
    flowtrain::write_file_atomically((data / "val.csv").string(), val);
    for (const char* name : {"labels.txt", "groups.csv"}) {
      if (fs::exists(ctx.data_dir / name)) {
        fs::copy_file(ctx.data_dir / name, data / name, fs::copy_options::overwrite_existing);
      }
    }
    Invocation in = ctx.in;
    in.overrides.push_back("data.folder=" + data.string());
    in.overrides.push_back("output.dir=" + dir.string());
    contexts.push_back(load_context(std::move(in)));
  }
  return contexts;
}

int cv_command(const Context& ctx) {
  const auto begin = Clock::now();
  check_prepared(ctx);
  check_output_dir(ctx);
  const int folds = ctx.in.folds;
  const std::vector<Context> contexts = cv_folds(ctx, folds);
  const fs::path root = contexts.front().out_dir.parent_path();
  std::cout << "foodtag cv: " << folds << " folds of the photos in " << ctx.data_dir.string()
            << ", stratified by food group (data.seed "
            << ctx.section("data").get_int("seed") << "), in " << root.string() << "\n"
            << std::flush;

  std::vector<std::string> times;
  for (int f = 0; f < folds; ++f) {
    const Context& fold = contexts[static_cast<std::size_t>(f)];
    const auto fold_begin = Clock::now();
    for (const char* command : {"train-teacher", "distill", "baseline", "eval"}) {
      const std::string what =
          "fold " + std::to_string(f + 1) + "/" + std::to_string(folds) + ": " + command;
      if (done(fold, command)) {
        std::cout << "== foodtag cv " << what << " (done before, kept)\n" << std::flush;
        continue;
      }
      std::cout << "== foodtag cv " << what << "\n" << std::flush;
      Context resumable = fold;
      for (std::string& o : resume_overrides(fold, command)) {
        resumable.in.overrides.push_back(std::move(o));
      }
      ctx.in.nproc > 1 ? launch_phases(resumable, command) : run_phases(resumable, command);
    }
    times.push_back("fold " + std::to_string(f + 1) + " " + duration_text(seconds_since(fold_begin)));
  }

  // Every photo's held-out prediction, pooled over the folds.
  std::string partial;
  std::vector<Pooled> models;
  for (const std::string& name : pooled_models(contexts, partial)) {
    Pooled m{.name = name, .all = {.name = name}};
    for (const Context& fold : contexts) {
      const Predictions p =
          read_predictions(name, (fold.out_dir / "predictions" / (name + ".csv")).string());
      const auto right = static_cast<std::uint64_t>(std::count(p.right.begin(), p.right.end(), true));
      m.right += right;
      m.fold_top1.push_back(p.right.empty() ? 0 : static_cast<double>(right) / p.right.size());
      // The energy errors of foodtag's own models (their eval profiles); none for the others.
      const fs::path profile = fold.profile(name + "_eval");
      const std::optional<flowtrain::RunReport> eval =
          fs::exists(profile) ? std::optional(flowtrain::read_report_file(profile.string()))
                              : std::nullopt;
      const auto photos = static_cast<double>(p.right.size());
      m.mae_sum += photos * (eval ? stage_result(*eval, "mae").value_or(NAN) : NAN);
      m.group_mae_sum += photos * (eval ? stage_result(*eval, "mae_by_class").value_or(NAN) : NAN);
      m.all.paths.insert(m.all.paths.end(), p.paths.begin(), p.paths.end());
      m.all.right.insert(m.all.right.end(), p.right.begin(), p.right.end());
    }
    models.push_back(std::move(m));
  }
  double trivial_top1 = 0, trivial_mae = 0;
  for (const Context& fold : contexts) {
    if (const std::optional<ModelFacts> trivial = trivial_baseline(fold)) {
      trivial_top1 += trivial->top1 * static_cast<double>(trivial->validation_images);
      trivial_mae += trivial->mae_kcal * static_cast<double>(trivial->validation_images);
    }
  }
  const std::size_t photos = models.front().all.right.size();
  const auto n = static_cast<double>(photos);

  std::string text = "foodtag cv: " + std::to_string(folds) + " folds, data.seed " +
                     std::to_string(ctx.section("data").get_int("seed")) + ", " +
                     std::to_string(photos) + " photos, each held out once\n";
  std::string csv = "model,photos,right,top1,low,high,fold_min,fold_max,fold_sd,mae,group_mae\n";
  char line[256];
  std::snprintf(line, sizeof line, "  %-10s %-22s %-26s %-12s %s\n", "", "top-1 (95% interval)",
                "per fold (min-max, sd)", "energy MAE", "group-median MAE");
  text += line;
  for (const Pooled& m : models) {
    const auto [low, high] = wilson_interval(m.right, photos);
    double mean = 0, spread = 0;
    for (const double t : m.fold_top1) mean += t / static_cast<double>(m.fold_top1.size());
    for (const double t : m.fold_top1) spread += (t - mean) * (t - mean);
    const double sd = std::sqrt(spread / static_cast<double>(m.fold_top1.size() - 1));
    const auto [min, max] = std::minmax_element(m.fold_top1.begin(), m.fold_top1.end());
    const std::string top1 =
        percent(m.right / n) + " (" + percent(low) + "-" + percent(high) + ")";
    const std::string spread_text =
        percent(*min) + "-" + percent(*max) + " (sd " + percent(sd) + ")";
    char mae[32] = "", group_mae[32] = "";
    if (!std::isnan(m.mae_sum)) std::snprintf(mae, sizeof mae, "%.1f kcal", m.mae_sum / n);
    if (!std::isnan(m.group_mae_sum)) {
      std::snprintf(group_mae, sizeof group_mae, "%.1f kcal", m.group_mae_sum / n);
    }
    std::snprintf(line, sizeof line, "  %-10s %-22s %-26s %-12s %s\n", m.name.c_str(),
                  top1.c_str(), spread_text.c_str(), mae, group_mae);
    text += line;
    csv += flowtrain::csv_line(
        {m.name, std::to_string(photos), std::to_string(m.right),
         flowtrain::csv_number(m.right / n), flowtrain::csv_number(low),
         flowtrain::csv_number(high), flowtrain::csv_number(*min), flowtrain::csv_number(*max),
         flowtrain::csv_number(sd), flowtrain::csv_number(m.mae_sum / n),
         flowtrain::csv_number(m.group_mae_sum / n)});
  }
  char mae[32];
  std::snprintf(mae, sizeof mae, "%.1f kcal", trivial_mae / n);
  std::snprintf(line, sizeof line, "  %-10s %-22s %-26s %-12s %s\n", "no model",
                percent(trivial_top1 / n).c_str(), "", mae, "");
  text += line;
  text += partial;
  text += compare(models[1].all, models[2].all).text() + "\n";
  text += compare(models[1].all, models[0].all).text() + "\n";
  for (std::size_t i = 3; i < models.size(); ++i) {  // the others, against both references
    text += compare(models[i].all, models[2].all).text() + "\n";
    text += compare(models[i].all, models[0].all).text() + "\n";
  }
  text += "wall " + duration_text(seconds_since(begin)) + ":";
  for (const std::string& t : times) text += " " + t;
  text += "\n";
  flowtrain::write_file_atomically((root / "cv.csv").string(), csv);
  flowtrain::write_file_atomically((root / "cv.txt").string(), text);
  std::cout << text << "cv: " << (root / "cv.txt").string() << "\n";
  return 0;
}

}  // namespace foodtag
