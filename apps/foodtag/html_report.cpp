#include "apps/foodtag/html_report.hpp"
#include "apps/foodtag/compare.hpp"
#include "apps/foodtag/profile.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "graph/atomic_file.hpp"
#include "graph/error.hpp"

namespace foodtag {

namespace {

using flowtrain::RunReport;
using flowtrain::StageReport;
using Kind = flowtrain::StageShape::Kind;
using namespace chart;

// Where a stage's worker time goes: working, waiting for input, waiting for room downstream.
constexpr const char* kBusyColour = "#2e7d32";
constexpr const char* kStarvedColour = "#f2b134";
constexpr const char* kBlockedColour = "#c62828";
constexpr const char* kOtherColour = "#d0d0d0";

constexpr const char* kMissing = "–";

std::string percent(double fraction, int decimals = 0) {
  return fixed(fraction * 100, decimals) + "%";
}

// ---- table cells: "–" for what was not measured -------------------------------------------

std::string measured(double v, int decimals) {
  return std::isfinite(v) && v > 0 ? fixed(v, decimals) : kMissing;
}

// An accuracy 0..1 (negative: not measured; 0 is a real, if sad, result).
std::string accuracy_cell(double v) {
  return std::isfinite(v) && v >= 0 ? percent(v, 1) : kMissing;
}

// A top-1 with its 95% interval when the photo count is known: "58.0% (48.8-66.8)".
std::string top1_cell(const ModelFacts& m) {
  if (m.validation_images == 0 || !(std::isfinite(m.top1) && m.top1 >= 0)) {
    return accuracy_cell(m.top1);
  }
  const auto right = static_cast<std::uint64_t>(
      std::llround(m.top1 * static_cast<double>(m.validation_images)));
  const auto [low, high] = wilson_interval(right, m.validation_images);
  return percent(m.top1, 1) + " (" + fixed(low * 100, 1) + "-" + fixed(high * 100, 1) + ")";
}

// An error in kcal (negative: not measured).
std::string kcal_cell(double v) { return std::isfinite(v) && v >= 0 ? fixed(v, 1) : kMissing; }

std::string parameters_cell(std::int64_t n) {
  if (n <= 0) return kMissing;
  if (n >= 1000000) return fixed(static_cast<double>(n) / 1e6, 2) + " M";
  if (n >= 1000) return fixed(static_cast<double>(n) / 1e3, 1) + " k";
  return std::to_string(n);
}

std::string ratio_cell(double numerator, double denominator) {
  if (!(numerator > 0 && denominator > 0 && std::isfinite(numerator / denominator))) {
    return kMissing;
  }
  const double r = numerator / denominator;
  return fixed(r, r < 10 ? 2 : 1) + "×";
}

std::string cells(const std::vector<std::string>& values,
                  const char* tag = "td",
                  const std::string& row_class = "") {
  std::string row = row_class.empty() ? "<tr>" : "<tr class=\"" + row_class + "\">";
  for (const std::string& v : values) {
    row += std::string("<") + tag + ">" + escape(v) + "</" + tag + ">";
  }
  return row + "</tr>\n";
}

// ---- the sections ---------------------------------------------------------------------------

// A model keeps one colour in every chart: its place in data.models (else the curve's own). A
// curve belongs to a model when its name is the model's, or starts with it and a space.
std::vector<std::string> model_colours(const std::vector<Curve>& curves,
                                       const std::vector<ModelFacts>& models) {
  std::vector<std::string> colours;
  for (std::size_t i = 0; i < curves.size(); ++i) {
    std::size_t index = i;
    for (std::size_t m = 0; m < models.size(); ++m) {
      const std::string& n = curves[i].name;
      if (n == models[m].name || n.rfind(models[m].name + " ", 0) == 0) index = m;
    }
    colours.push_back(palette_colour(index));
  }
  return colours;
}

std::string header_section(const ReportData& d) {
  std::string out = "<header>\n<h1>" + escape(d.title) + "</h1>\n<p class=\"meta\">";
  if (!d.created.empty()) out += "created " + escape(d.created);
  if (!d.created.empty() && !d.machine.empty()) out += " · ";
  if (!d.machine.empty()) out += "on " + escape(d.machine);
  if (!d.phases.empty()) {
    // The phases' wall time together (what `foodtag run` took, the data and export aside).
    double wall_s = 0;
    std::string names;
    for (const PhaseProfile& p : d.phases) {
      wall_s += p.report.wall_s;
      names += (names.empty() ? "" : ", ") + p.name;
    }
    out += "</p>\n<p class=\"meta\"><b>run time " + escape(duration_text(wall_s)) + "</b> (" +
           escape(names) + ")";
  }
  out += "</p>\n";
  if (!d.verdict.empty()) out += "<div class=\"verdict\">" + escape(d.verdict) + "</div>\n";
  return out + "</header>\n";
}

const ModelFacts* find_model(const std::vector<ModelFacts>& models, const std::string& name) {
  for (const ModelFacts& m : models) {
    if (m.name == name) return &m;
  }
  return nullptr;
}

// The students of `foodtag sweep`, as its sweep.csv lists them.
std::string sweep_section(const std::vector<std::vector<std::string>>& rows) {
  if (rows.size() < 2) return "";
  std::string out =
      "<section id=\"sweep\">\n<h2>Sweep</h2>\n<p>Students trained by <code>foodtag sweep</code> "
      "against one teacher cache, each beside the same student on labels alone trained as long "
      "(validation top-1 with its 95% interval, low to high; the labels-only top-1; the photos "
      "only the student and only the labels-only student got right, and McNemar's p; energy "
      "MAE; minutes of distillation and of the labels-only training; the share of views whose "
      "teacher outputs came from the cache).</p>\n<table class=\"models\">\n";
  std::vector<std::string> header = rows.front();  // sweep.csv's names, which wrap at spaces
  for (std::string& name : header) std::replace(name.begin(), name.end(), '_', ' ');
  out += cells(header, "th");
  for (std::size_t i = 1; i < rows.size(); ++i) out += cells(rows[i]);
  return out + "</table>\n</section>\n";
}

std::string models_section(const std::vector<ModelFacts>& models,
                           const std::vector<std::string>& comparisons) {
  std::string out = "<section id=\"models\">\n<h2>Models</h2>\n";
  if (models.empty()) return out + "<p class=\"no-data\">no models measured</p>\n</section>\n";
  out += "<table class=\"models\">\n" +
         cells({"model", "parameters", "file (MB)", "val top-1 (95% interval)", "val top-5",
                "energy MAE (kcal / 100 g)", "its group's median: MAE (kcal / 100 g)",
                "inference (images/s)", "inference (ms / image)"},
               "th");
  for (const ModelFacts& m : models) {
    out += cells({m.name, parameters_cell(m.parameters), measured(m.file_mb, 1),
                  top1_cell(m), accuracy_cell(m.top5),
                  kcal_cell(m.mae_kcal), kcal_cell(m.mae_group_kcal), measured(m.images_per_s, 1),
                  measured(m.ms_per_image, 2)});
  }
  const ModelFacts* teacher = find_model(models, "teacher");
  const ModelFacts* student = find_model(models, "student");
  if (teacher && student) {
    out += cells({"student / teacher",
                  ratio_cell(static_cast<double>(student->parameters),
                             static_cast<double>(teacher->parameters)),
                  ratio_cell(student->file_mb, teacher->file_mb), "", "", "", "",
                  ratio_cell(student->images_per_s, teacher->images_per_s),
                  ratio_cell(student->ms_per_image, teacher->ms_per_image)},
                 "td", "ratio");
  }
  out += "</table>\n";
  if (teacher && student) {
    out += "<p class=\"facts\"><b>student / teacher:</b> " +
           ratio_cell(student->images_per_s, teacher->images_per_s) + " the speed (images/s), " +
           ratio_cell(student->file_mb, teacher->file_mb) + " the size (file)</p>\n";
  }
  if (!comparisons.empty()) {
    out += "<p class=\"facts\"><b>Photo by photo:</b></p>\n<ul class=\"comparisons\">\n";
    for (const std::string& c : comparisons) out += "<li>" + escape(c) + "</li>\n";
    out += "</ul>\n";
  }
  return out + "</section>\n";
}

std::string training_section(const ReportData& d) {
  const LineChart loss{.id = "loss-chart",
                       .title = "Training loss",
                       .x_label = "step",
                       .y_label = "loss",
                       .curves = d.loss,
                       .colours = model_colours(d.loss, d.models),
                       .empty_note = "no loss recorded"};
  const LineChart accuracy{.id = "accuracy-chart",
                           .title = "Accuracy: training per epoch, validation (dashed)",
                           .x_label = "step",
                           .y_label = "top-1",
                           .curves = d.accuracy,
                           .colours = model_colours(d.accuracy, d.models),
                           .y_include = {0, 1},
                           .empty_note = "no accuracy recorded"};
  BarChart top1{.id = "top1-chart",
                .title = "Validation top-1",
                .x_label = "validation top-1 (%)",
                .empty_note = "no validation accuracy measured"};
  for (std::size_t i = 0; i < d.models.size(); ++i) {
    const ModelFacts& m = d.models[i];
    if (!(std::isfinite(m.top1) && m.top1 >= 0)) continue;
    top1.bars.push_back({m.name, "", percent(m.top1, 1), {{m.top1 * 100, palette_colour(i)}}});
  }
  return "<section id=\"training\">\n<h2>Training</h2>\n<div class=\"charts\">\n" +
         line_chart(loss) + line_chart(accuracy) + bar_chart(top1) + "</div>\n</section>\n";
}

// Items a stage handled per second of the run: a source's emitted items, else those it took in
// (a sink emits none), as in format_report.
double items_per_s(const StageReport& s, double wall_s) {
  const std::uint64_t items = s.kind == Kind::kSource ? s.items_out : s.items_in;
  return wall_s > 0 ? static_cast<double>(items) / wall_s : 0;
}

std::string rate_text(double per_s) { return fixed(per_s, per_s < 10 ? 1 : 0); }

// What a stage's items are, in the words of a rate: "images", "batches", "steps".
std::string item_unit(const std::string& item) {
  if (item == "Sample" || item == "BatchRow") return "images";
  if (item == "Batch") return "batches";
  if (item == "StepRecord") return "steps";
  if (item == "GradBucket") return "buckets";
  return item.empty() ? "items" : item + " items";
}

std::string utilisation_chart(const RunReport& r, const std::string& id) {
  BarChart c{.id = id,
             .title = "Where each stage's worker time goes",
             .x_label = "% of worker time",
             .legend = {{"busy", kBusyColour, LegendEntry::Swatch::kBox},
                        {"starved (no input)", kStarvedColour, LegendEntry::Swatch::kBox},
                        {"blocked (output full)", kBlockedColour, LegendEntry::Swatch::kBox},
                        {"other", kOtherColour, LegendEntry::Swatch::kBox}},
             .empty_note = "no stages"};
  for (const StageReport& s : r.stages) {
    double busy = std::max(0.0, s.busy_fraction), starved = std::max(0.0, s.starved_fraction),
           blocked = std::max(0.0, s.blocked_fraction);
    const double sum = busy + starved + blocked;
    if (sum > 1) {  // sampled shares can overshoot a little: scale them to the bar
      busy /= sum;
      starved /= sum;
      blocked /= sum;
    }
    const double other = std::max(0.0, 1 - busy - starved - blocked);
    c.bars.push_back({s.name,
                      std::to_string(s.workers) + (s.workers == 1 ? " worker" : " workers"),
                      rate_text(items_per_s(s, r.wall_s)) + " " + item_unit(s.item) + "/s",
                      {{busy * 100, kBusyColour},
                       {starved * 100, kStarvedColour},
                       {blocked * 100, kBlockedColour},
                       {other * 100, kOtherColour}}});
  }
  return bar_chart(c);
}

std::string queue_chart(const RunReport& r, const std::string& id) {
  LineChart c{.id = id,
              .title = "Input queue occupancy (dashed: capacity)",
              .x_label = "time (s)",
              .y_label = "items in queue",
              .y_include = {0},
              .empty_note = "no queue samples"};
  for (const StageReport& s : r.stages) {
    if (s.queue_series.empty()) continue;
    Curve curve{s.name + " (cap " + std::to_string(s.queue_capacity) + ")", {}, {}};
    for (const flowtrain::QueueSample& q : s.queue_series) {
      curve.x.push_back(q.time_s);
      curve.y.push_back(q.occupancy);
    }
    if (s.queue_capacity > 0) {
      c.marks.push_back({static_cast<double>(s.queue_capacity), palette_colour(c.curves.size())});
    }
    c.curves.push_back(std::move(curve));
  }
  return line_chart(c);
}

double mean(const std::vector<double>& values) {
  double sum = 0;
  std::size_t n = 0;
  for (const double v : values) {
    if (!std::isfinite(v)) continue;
    sum += v;
    ++n;
  }
  return n ? sum / static_cast<double>(n) : 0;
}

// Empty when no CPU samples were taken.
std::string cpu_chart(const flowtrain::CpuReport& cpu, const std::string& id) {
  if (cpu.cores.empty() || cpu.times_s.empty()) return "";
  LineChart c{.id = id,
              .title = "CPU per core, all processes",
              .x_label = "time (s)",
              .y_label = "busy (%)",
              .y_include = {0, 100}};
  for (std::size_t k = 0; k < cpu.cores.size(); ++k) {
    const std::vector<double>& samples = cpu.cores[k];
    const double core_mean = k < cpu.core_mean.size() ? cpu.core_mean[k] : mean(samples);
    Curve curve{"core " + std::to_string(k) + " (mean " + percent(core_mean) + ")", {}, {}};
    for (std::size_t i = 0; i < std::min(samples.size(), cpu.times_s.size()); ++i) {
      curve.x.push_back(cpu.times_s[i]);
      curve.y.push_back(samples[i] * 100);
    }
    c.curves.push_back(std::move(curve));
    c.colours.push_back(core_colour(k));
  }
  return line_chart(c);
}

std::string stage_table(const RunReport& r) {
  std::string out = "<figure><figcaption>Stages</figcaption>\n<table class=\"stages\">\n" +
                    cells({"stage", "kind", "workers", "busy", "starved", "blocked",
                           "rate (per s)", "queue mean / max / cap"},
                          "th");
  for (const StageReport& s : r.stages) {
    const bool source = s.kind == Kind::kSource, sink = s.kind == Kind::kSink;
    out +=
        cells({s.name, flowtrain::to_string(s.kind), std::to_string(s.workers),
               percent(s.busy_fraction), source ? kMissing : percent(s.starved_fraction),
               sink ? kMissing : percent(s.blocked_fraction),
               rate_text(items_per_s(s, r.wall_s)) + " " + item_unit(s.item),
               source ? kMissing
                      : fixed(s.queue_mean, 1) + " / " + fixed(s.queue_max, 0) + " / " +
                            std::to_string(s.queue_capacity)});
  }
  return out + "</table>\n</figure>\n";
}

// The layouts autotune tried, with their rates, and the settings it chose.
std::string autotune_table(const flowtrain::AutotuneReport& a) {
  std::string caption = "Autotune: " + std::to_string(a.trials.size()) + " trial(s)";
  if (a.rehearsal_s > 0) {
    caption += ", " + fixed(a.rehearsal_s, 1) + " s of rehearsals before the run";
  }
  if (a.tuning_s > 0) caption += ", " + fixed(a.tuning_s, 1) + " s on the run's own work";
  std::string out = "<figure><figcaption>" + escape(caption) +
                    "</figcaption>\n<table class=\"stages\">\n" +
                    cells({"trial", "on", "items/s", "kept", "change", "layout"}, "th");
  const flowtrain::AutotuneTrial* chosen = a.chosen();
  for (std::size_t i = 0; i < a.trials.size(); ++i) {
    const flowtrain::AutotuneTrial& t = a.trials[i];
    out += cells({std::to_string(i + 1), t.rehearsal ? "rehearsal" : "the run",
                  rate_text(t.items_per_s), t.kept ? "yes" : "", t.change, t.layout},
                 "td", &t == chosen ? "chosen" : "");
  }
  std::string settings;
  for (const std::string& o : a.overrides) settings += (settings.empty() ? "" : " ") + o;
  if (settings.empty()) settings = "the config's own layout was the fastest tried";
  return out + "</table>\n<p class=\"facts\"><b>chosen settings:</b> " + escape(settings) +
         "</p>\n</figure>\n";
}

std::string phase_section(const PhaseProfile& phase, std::size_t index) {
  const RunReport& r = phase.report;
  const std::string n = std::to_string(index);
  std::string out = "<section class=\"phase\" id=\"phase-" + n +
                    "\">\n<h2>Phase: " + escape(phase.name) + "</h2>\n";
  out += "<p class=\"facts\"><b>verdict:</b> " + escape(r.verdict()) + "</p>\n";
  out += "<p class=\"facts\"><b>layout:</b> " + escape(r.layout()) + "</p>\n";
  for (const flowtrain::StageReport& stage : r.stages) {
    // A pipeline's schedule as it ran: partitions x time, forwards and backwards, the bubble.
    if (const std::string chart = flowtrain::format_timeline(stage); !chart.empty()) {
      out += "<pre class=\"timeline\">" + escape(chart) + "</pre>\n";
    }
  }
  std::string run = "wall " + fixed(r.wall_s, 2) + " s";
  if (r.cpu.process_cpu_s > 0 && r.wall_s > 0) {
    run += "; this process used " + fixed(r.cpu.process_cpu_s, 1) + " CPU-s (" +
           fixed(r.cpu.process_cpu_s / r.wall_s, 2) + " cores on average) and took " +
           fixed(static_cast<double>(r.cpu.page_faults) / r.wall_s, 0) + " page faults a second";
  }
  if (r.stopped) run += "; stopped early on request: the counts are what was completed";
  out += "<p class=\"facts\"><b>run:</b> " + escape(run) + "</p>\n";
  if (const std::string split = step_split(r); !split.empty()) {
    out += "<p class=\"facts\">" + escape(split) + "</p>\n";  // "per step: ... GFLOP/s"
  }
  if (const std::string cache = cache_summary(r); !cache.empty()) {
    out += "<p class=\"facts\">" + escape(cache) + "</p>\n";
  }
  out += "<div class=\"charts\">\n" + utilisation_chart(r, "utilisation-chart-" + n) +
         queue_chart(r, "queue-chart-" + n) + cpu_chart(r.cpu, "cpu-chart-" + n) + stage_table(r) +
         (r.autotune ? autotune_table(*r.autotune) : std::string()) + "</div>\n";
  return out + "</section>\n";
}

constexpr const char* kStyle = R"(
body { margin: 0; background: #fff; color: #222;
       font: 14px/1.45 "DejaVu Sans", "Liberation Sans", Arial, Helvetica, sans-serif; }
main { max-width: 1120px; margin: 0 auto; padding: 16px 20px 40px; }
h1 { font-size: 26px; margin: 6px 0 2px; }
h2 { font-size: 20px; margin: 30px 0 10px; padding-bottom: 4px; border-bottom: 1px solid #ddd; }
.meta { color: #555; margin: 0 0 12px; }
.verdict { background: #fff5d6; border-left: 6px solid #e0a200; padding: 10px 14px;
           font-size: 16px; font-weight: bold; }
.facts { margin: 4px 0; }
.charts { display: flex; flex-wrap: wrap; gap: 22px 20px; align-items: flex-start; margin-top: 12px; }
figure { margin: 0; }
tr.chosen td { font-weight: bold; }
figcaption { font-weight: bold; margin-bottom: 4px; }
svg.chart { display: block; }
svg.chart text { font-size: 12px; fill: #333; }
svg.chart text.axis-label { font-size: 13px; fill: #111; }
svg.chart text.sub { font-size: 11px; fill: #666; }
.no-data { width: 510px; margin: 0; padding: 40px 20px; color: #888; font-style: italic;
           text-align: center; border: 1px dashed #ccc; }
table { border-collapse: collapse; }
th, td { padding: 4px 10px; border-bottom: 1px solid #e4e4e4; text-align: right; white-space: nowrap; }
th { white-space: normal; vertical-align: bottom; }  /* headers wrap: the numbers set the widths */
table.models td:first-child { white-space: normal; max-width: 14em; }  /* long model names wrap */
th:first-child, td:first-child { text-align: left; }
th { background: #f3f3f3; }
tr.ratio td { font-style: italic; color: #444; background: #fafafa; }
pre { background: #f6f6f6; padding: 10px 12px; font-size: 12px; white-space: pre-wrap; }
)";

}  // namespace

std::string render_html(const ReportData& data) {
  std::string html =
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>" +
      escape(data.title) + "</title>\n<style>" + kStyle + "</style>\n</head>\n<body>\n<main>\n";
  html += header_section(data);
  html += models_section(data.models, data.comparisons);
  html += training_section(data);
  html += sweep_section(data.sweep);
  for (std::size_t i = 0; i < data.phases.size(); ++i) html += phase_section(data.phases[i], i);
  html += "<section id=\"config\">\n<h2>Effective config</h2>\n<pre>" +
          escape(data.config_text.empty() ? "(none)" : data.config_text) + "</pre>\n</section>\n";
  return html + "</main>\n</body>\n</html>\n";
}

void write_html_report(const ReportData& data, const std::string& path) {
  flowtrain::write_file_atomically(path, render_html(data));
}

}  // namespace foodtag
