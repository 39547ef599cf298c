#include "apps/foodtag/svg_chart.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <limits>

namespace foodtag::chart {

namespace {

// Series colours (models, queues). CPU cores take them from the end, so a core is not read as
// the stage or model of the same colour in the chart above it.
constexpr const char* kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
constexpr std::size_t kPaletteSize = std::size(kPalette);

constexpr std::size_t kMaxPoints = 1000;   // per drawn curve
constexpr std::size_t kMarkedPoints = 30;  // curves this short get a dot on every point
constexpr double kChartWidth = 550;        // two charts side by side in the 1120 px page
constexpr double kLineChartHeight = 320;
constexpr double kBottomMargin = 44;  // x tick labels and the x axis label
constexpr double kRightMargin = 16;
constexpr double kCharWidth = 7;  // of 12 px text, a little generous, for layout

}  // namespace

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

namespace {

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

}  // namespace

std::string figure(const std::string& title, const std::string& body) {
  return "<figure><figcaption>" + escape(title) + "</figcaption>\n" + body + "</figure>\n";
}

namespace {

std::string no_data(const std::string& title, const std::string& note) {
  return figure(title, "<p class=\"no-data\">" + escape(note) + "</p>\n");
}

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

}  // namespace

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

}  // namespace foodtag::chart
