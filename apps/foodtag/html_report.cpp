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

// Series colours (models, queues). CPU cores take them from the end, so a core is not read as
// the stage or model of the same colour in the chart above it.
constexpr const char* kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
constexpr std::size_t kPaletteSize = std::size(kPalette);
// Where a stage's worker time goes: working, waiting for input, waiting for room downstream.
constexpr const char* kBusyColour = "#2e7d32";
constexpr const char* kStarvedColour = "#f2b134";
constexpr const char* kBlockedColour = "#c62828";
constexpr const char* kOtherColour = "#d0d0d0";

constexpr std::size_t kMaxPoints = 1000;   // per drawn curve
constexpr std::size_t kMarkedPoints = 30;  // curves this short get a dot on every point
constexpr double kChartWidth = 550;        // two charts side by side in the 1120 px page
constexpr double kLineChartHeight = 320;
constexpr double kBottomMargin = 44;  // x tick labels and the x axis label
constexpr double kRightMargin = 16;
constexpr double kCharWidth = 7;  // of 12 px text, a little generous, for layout
constexpr const char* kMissing = "–";

std::string palette_colour(std::size_t i) { return kPalette[i % kPaletteSize]; }
std::string core_colour(std::size_t i) { return kPalette[kPaletteSize - 1 - i % kPaletteSize]; }

std::string escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

std::string percent(double fraction, int decimals = 0) {
  return fixed(fraction * 100, decimals) + "%";
}

// An SVG coordinate.
std::string num(double v) { return fixed(v, 1); }

double text_width(const std::string& s) { return static_cast<double>(s.size()) * kCharWidth; }

// At most `max_bytes` of `s` (cut at a UTF-8 character boundary), "…" marking a cut.
std::string shorten(const std::string& s, std::size_t max_bytes) {
  if (s.size() <= max_bytes) return s;
  std::size_t end = max_bytes - 1;
  while (end > 0 && (static_cast<unsigned char>(s[end]) & 0xC0) == 0x80) --end;
  return s.substr(0, end) + "…";
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

// ---- axes and the plot area -----------------------------------------------------------------

// An axis range with round ticks.
struct Axis {
  double lo = 0, hi = 1, step = 0.2;
  int decimals = 1;  // of the tick labels

  std::vector<double> ticks() const {
    // Counted, not summed: a step below the precision of `lo` would never reach `hi`.
    const long n = std::lround((hi - lo) / step);
    std::vector<double> out;
    for (long k = 0; k <= n; ++k) out.push_back(lo + static_cast<double>(k) * step);
    return out;
  }
  std::string label(double t) const { return fixed(std::abs(t) < step * 1e-6 ? 0 : t, decimals); }
};

// The smallest range with round ticks (1, 2 or 5 x 10^k apart, about five of them) that covers
// [lo, hi]. A single value gets some room around it.
Axis nice_axis(double lo, double hi) {
  if (!(hi > lo)) {
    const double pad = lo == 0 ? 1 : std::abs(lo) * 0.1;
    lo -= pad;
    hi += pad;
  }
  const double raw = (hi - lo) / 5;
  const double magnitude = std::pow(10, std::floor(std::log10(raw)));
  double step = 10 * magnitude;
  for (const double m : {1.0, 2.0, 5.0}) {
    if (raw <= m * magnitude * (1 + 1e-9)) {
      step = m * magnitude;
      break;
    }
  }
  Axis a;
  a.step = step;
  a.lo = std::floor(lo / step + 1e-9) * step;
  a.hi = std::ceil(hi / step - 1e-9) * step;
  a.decimals = std::max(0, -static_cast<int>(std::floor(std::log10(step) + 1e-9)));
  return a;
}

// The lowest and highest of the values seen.
struct Range {
  double lo = std::numeric_limits<double>::infinity();
  double hi = -std::numeric_limits<double>::infinity();
  void add(double v) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  bool empty() const { return lo > hi; }
};

// Where a chart's data goes inside its SVG.
struct Plot {
  double left = 0, top = 0, width = 0, height = 0;
  Axis x, y;
  double px(double v) const { return left + (v - x.lo) / (x.hi - x.lo) * width; }
  double py(double v) const { return top + height - (v - y.lo) / (y.hi - y.lo) * height; }
  double bottom() const { return top + height; }
  double right() const { return left + width; }
};

// ---- SVG primitives -------------------------------------------------------------------------

void svg_text(std::string& svg,
              double x,
              double y,
              const char* anchor,
              const std::string& text,
              const std::string& attributes = "") {
  svg += "<text x=\"" + num(x) + "\" y=\"" + num(y) + "\" text-anchor=\"" + anchor + "\"" +
         attributes + ">" + escape(text) + "</text>\n";
}

void svg_line(std::string& svg,
              double x1,
              double y1,
              double x2,
              double y2,
              const std::string& colour,
              double width = 1,
              const std::string& attributes = "") {
  svg += "<line x1=\"" + num(x1) + "\" y1=\"" + num(y1) + "\" x2=\"" + num(x2) + "\" y2=\"" +
         num(y2) + "\" stroke=\"" + colour + "\" stroke-width=\"" + num(width) + "\"" + attributes +
         "/>\n";
}

void svg_rect(std::string& svg, double x, double y, double w, double h, const std::string& fill) {
  svg += "<rect x=\"" + num(x) + "\" y=\"" + num(y) + "\" width=\"" + num(w) + "\" height=\"" +
         num(h) + "\" fill=\"" + fill + "\"/>\n";
}

std::string svg_open(const std::string& id, double width, double height) {
  return "<svg class=\"chart\" id=\"" + escape(id) + "\" width=\"" + num(width) + "\" height=\"" +
         num(height) + "\" viewBox=\"0 0 " + num(width) + " " + num(height) + "\" role=\"img\">\n";
}

std::string figure(const std::string& title, const std::string& body) {
  return "<figure><figcaption>" + escape(title) + "</figcaption>\n" + body + "</figure>\n";
}

std::string no_data(const std::string& title, const std::string& note) {
  return figure(title, "<p class=\"no-data\">" + escape(note) + "</p>\n");
}

struct LegendEntry {
  enum class Swatch { kLine, kDashedLine, kBox };
  std::string label;
  std::string colour;
  Swatch swatch = Swatch::kLine;
};

// Draws the entries in rows across the top of a chart, from `left` over `width`; returns the
// height the rows take.
double draw_legend(std::string& svg,
                   const std::vector<LegendEntry>& entries,
                   double left,
                   double width) {
  constexpr double kRow = 18, kSwatch = 18, kGap = 18;
  double x = left, baseline = 14;
  for (const LegendEntry& e : entries) {
    const double w = kSwatch + 5 + text_width(e.label);
    if (x > left && x + w > left + width) {
      x = left;
      baseline += kRow;
    }
    if (e.swatch == LegendEntry::Swatch::kBox) {
      svg_rect(svg, x + 4, baseline - 10, 11, 11, e.colour);
    } else {
      svg_line(svg, x, baseline - 4, x + kSwatch, baseline - 4, e.colour, 3,
               e.swatch == LegendEntry::Swatch::kDashedLine ? " stroke-dasharray=\"5 3\"" : "");
    }
    svg_text(svg, x + kSwatch + 5, baseline, "start", e.label);
    x += w + kGap;
  }
  return entries.empty() ? 0 : baseline + 8;
}

// Vertical gridlines and the labelled ticks of the x axis under the plot.
void draw_x_axis(std::string& svg, const Plot& p, const std::string& label) {
  for (const double t : p.x.ticks()) {
    svg_line(svg, p.px(t), p.top, p.px(t), p.bottom() + 4, "#e3e3e3");
    svg_text(svg, p.px(t), p.bottom() + 17, "middle", p.x.label(t));
  }
  svg_text(svg, p.left + p.width / 2, p.bottom() + 36, "middle", label, " class=\"axis-label\"");
}

// Horizontal gridlines and the labelled ticks of the y axis left of the plot.
void draw_y_axis(std::string& svg, const Plot& p, const std::string& label) {
  for (const double t : p.y.ticks()) {
    svg_line(svg, p.left - 4, p.py(t), p.right(), p.py(t), "#e3e3e3");
    svg_text(svg, p.left - 7, p.py(t) + 4, "end", p.y.label(t));
  }
  const std::string at = num(14) + "," + num(p.top + p.height / 2);
  svg_text(svg, 0, 0, "middle", label,
           " class=\"axis-label\" transform=\"translate(" + at + ") rotate(-90)\"");
}

void draw_frame(std::string& svg, const Plot& p) {
  svg += "<rect x=\"" + num(p.left) + "\" y=\"" + num(p.top) + "\" width=\"" + num(p.width) +
         "\" height=\"" + num(p.height) + "\" fill=\"none\" stroke=\"#9a9a9a\"/>\n";
}

// ---- line chart -----------------------------------------------------------------------------

// At most kMaxPoints finite points of `c`: each of its buckets keeps its lowest and its highest
// point, so a long noisy curve keeps its band and its spikes.
Curve drawable(const Curve& c) {
  std::vector<std::size_t> finite;
  for (std::size_t i = 0; i < std::min(c.x.size(), c.y.size()); ++i) {
    if (std::isfinite(c.x[i]) && std::isfinite(c.y[i])) finite.push_back(i);
  }
  constexpr std::size_t kBuckets = kMaxPoints / 2;
  const std::size_t bucket = std::max<std::size_t>(1, (finite.size() + kBuckets - 1) / kBuckets);
  Curve out{c.name, {}, {}, c.dashed};
  auto keep = [&](std::size_t i) {
    out.x.push_back(c.x[i]);
    out.y.push_back(c.y[i]);
  };
  for (std::size_t b = 0; b < finite.size(); b += bucket) {
    if (bucket == 1) {
      keep(finite[b]);
      continue;
    }
    const auto first = finite.begin() + static_cast<std::ptrdiff_t>(b);
    const auto last =
        finite.begin() + static_cast<std::ptrdiff_t>(std::min(b + bucket, finite.size()));
    const auto [low, high] = std::minmax_element(
        first, last, [&](std::size_t i, std::size_t j) { return c.y[i] < c.y[j]; });
    keep(std::min(*low, *high));
    if (*low != *high) keep(std::max(*low, *high));
  }
  return out;
}

// A dashed horizontal line across a line chart (a queue's capacity).
struct Mark {
  double y = 0;
  std::string colour;
};

struct LineChart {
  std::string id;
  std::string title;
  std::string x_label, y_label;
  std::vector<Curve> curves;         // a curve's name is its legend label
  std::vector<std::string> colours;  // per curve; empty: the palette in order
  std::vector<double> y_include;     // values the y axis must reach (0, 1, a capacity...)
  std::vector<Mark> marks;
  std::string empty_note = "no data";
};

std::string line_chart(const LineChart& c) {
  std::vector<Curve> curves;
  Range xs, ys;
  for (const Curve& curve : c.curves) {
    curves.push_back(drawable(curve));
    for (const double x : curves.back().x) xs.add(x);
    for (const double y : curves.back().y) ys.add(y);
  }
  if (xs.empty()) return no_data(c.title, c.empty_note);
  for (const double y : c.y_include) ys.add(y);
  for (const Mark& m : c.marks) ys.add(m.y);
  auto colour = [&](std::size_t i) {
    return i < c.colours.size() ? c.colours[i] : palette_colour(i);
  };

  Plot p;
  p.x = nice_axis(xs.lo, xs.hi);
  p.y = nice_axis(ys.lo, ys.hi);
  double widest_tick = 0;
  for (const double t : p.y.ticks()) widest_tick = std::max(widest_tick, text_width(p.y.label(t)));
  p.left = 30 + widest_tick;
  p.width = kChartWidth - p.left - kRightMargin;

  std::string body;
  std::vector<LegendEntry> legend;
  for (std::size_t i = 0; i < curves.size(); ++i) {
    legend.push_back({curves[i].name, colour(i),
                      curves[i].dashed ? LegendEntry::Swatch::kDashedLine
                                       : LegendEntry::Swatch::kLine});
  }
  p.top = draw_legend(body, legend, p.left, p.width) + 8;
  p.height = kLineChartHeight - p.top - kBottomMargin;

  draw_x_axis(body, p, c.x_label);
  draw_y_axis(body, p, c.y_label);
  draw_frame(body, p);
  for (const Mark& m : c.marks) {
    svg_line(body, p.left, p.py(m.y), p.right(), p.py(m.y), m.colour, 1.5,
             " stroke-dasharray=\"7 4\"");
  }
  for (std::size_t i = 0; i < curves.size(); ++i) {
    const Curve& curve = curves[i];
    std::string points;
    for (std::size_t k = 0; k < curve.x.size(); ++k) {
      if (k > 0) points += ' ';
      points += num(p.px(curve.x[k])) + "," + num(p.py(curve.y[k]));
    }
    body += "<polyline fill=\"none\" stroke=\"" + colour(i) +
            "\" stroke-width=\"2\" stroke-linejoin=\"round\"" +
            (curve.dashed ? " stroke-dasharray=\"7 4\"" : "") + " points=\"" + points + "\"/>\n";
    if (curve.x.size() > kMarkedPoints) continue;
    for (std::size_t k = 0; k < curve.x.size(); ++k) {
      body += "<circle cx=\"" + num(p.px(curve.x[k])) + "\" cy=\"" + num(p.py(curve.y[k])) +
              "\" r=\"3.5\" fill=\"" + colour(i) + "\"/>\n";
    }
  }
  return figure(c.title, svg_open(c.id, kChartWidth, kLineChartHeight) + body + "</svg>\n");
}

// ---- bar chart: horizontal bars, each a stack of segments --------------------------------------

struct Segment {
  double value = 0;
  std::string colour;
};

struct Bar {
  std::string label;     // left of the bar
  std::string sublabel;  // under the label, smaller
  std::string note;      // right of the plot
  std::vector<Segment> segments;
};

struct BarChart {
  std::string id;
  std::string title;
  std::string x_label;
  double x_max = 100;  // the x axis runs from 0
  std::vector<LegendEntry> legend;
  std::vector<Bar> bars;
  std::string empty_note = "no data";
};

std::string bar_chart(const BarChart& c) {
  if (c.bars.empty()) return no_data(c.title, c.empty_note);
  constexpr std::size_t kLabelChars = 24;
  constexpr double kRow = 34, kThickness = 22;
  double label_width = 0, note_width = 0;
  for (const Bar& b : c.bars) {
    label_width =
        std::max({label_width, text_width(shorten(b.label, kLabelChars)), text_width(b.sublabel)});
    note_width = std::max(note_width, text_width(b.note));
  }
  Plot p;
  p.x = nice_axis(0, c.x_max);
  p.left = 16 + label_width;
  p.width = kChartWidth - p.left - note_width - 8 - kRightMargin;

  std::string body;
  p.top = draw_legend(body, c.legend, p.left, p.width) + 8;
  p.height = kRow * static_cast<double>(c.bars.size());
  const double height = p.bottom() + kBottomMargin;

  draw_x_axis(body, p, c.x_label);
  for (std::size_t i = 0; i < c.bars.size(); ++i) {
    const Bar& b = c.bars[i];
    const double middle = p.top + kRow * (static_cast<double>(i) + 0.5);
    double at = 0;
    for (const Segment& s : b.segments) {
      if (!(std::isfinite(s.value) && s.value > 0)) continue;
      const double end = std::min(at + s.value, p.x.hi);
      svg_rect(body, p.px(at), middle - kThickness / 2, p.px(end) - p.px(at), kThickness, s.colour);
      at = end;
    }
    const bool two_lines = !b.sublabel.empty();
    svg_text(body, p.left - 8, middle + (two_lines ? -2 : 4), "end", shorten(b.label, kLabelChars));
    if (two_lines) svg_text(body, p.left - 8, middle + 12, "end", b.sublabel, " class=\"sub\"");
    svg_text(body, p.right() + 8, middle + 4, "start", b.note);
  }
  draw_frame(body, p);
  return figure(c.title, svg_open(c.id, kChartWidth, height) + body + "</svg>\n");
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
