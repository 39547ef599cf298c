#pragma once

// The SVG chart kit of foodtag's HTML report: line charts and stacked bar charts as inline SVG,
// each with a legend, round ticks and gridlines, 550 px wide (two side by side in the page);
// and the escaping and number text the report's tables share with them.

#include <cstddef>
#include <string>
#include <vector>

namespace foodtag {

/// A named series of (x, y) points for a line chart.
struct Curve {
  std::string name;  // its legend label; "teacher ..." takes the teacher's colour
  std::vector<double> x, y;
  bool dashed = false;  // e.g. validation, beside the solid training curve of the same model
};

namespace chart {

/// The i-th colour of the series palette (models, queues); core_colour takes them from its end,
/// so a CPU core is not read as the stage or model of the same colour in the chart above it.
std::string palette_colour(std::size_t i);
std::string core_colour(std::size_t i);
/// `text` with &, <, >, " and ' escaped for HTML.
std::string escape(const std::string& text);
/// `v` with `decimals` decimals.
std::string fixed(double v, int decimals);
/// A captioned figure around `body` (an SVG, or a note).
std::string figure(const std::string& title, const std::string& body);

struct LegendEntry {
  enum class Swatch { kLine, kDashedLine, kBox };
  std::string label;
  std::string colour;
  Swatch swatch = Swatch::kLine;
};

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

/// The chart's figure: its curves (at most 1,000 points each, a long curve's band and spikes
/// kept), or `empty_note` when no curve has a finite point.
std::string line_chart(const LineChart& c);
/// The chart's figure: a row for each bar, its segments stacked from 0, or `empty_note`.
std::string bar_chart(const BarChart& c);

}  // namespace chart
}  // namespace foodtag
