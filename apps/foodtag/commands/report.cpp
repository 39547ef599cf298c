#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <regex>
#include <sstream>

#include "apps/foodtag/commands/command.hpp"
#include "apps/foodtag/compare.hpp"
#include "apps/foodtag/html_report.hpp"
#include "graph/csv.hpp"
#include "graph/report_io.hpp"

namespace foodtag {

namespace {

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

}  // namespace

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

}  // namespace foodtag
