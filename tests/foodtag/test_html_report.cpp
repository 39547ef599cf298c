#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <string>
#include <vector>

#include "apps/foodtag/html_report.hpp"
#include "graph/error.hpp"
#include "tests/process.hpp"
#include "tests/temp_dir.hpp"

using flowtrain::StageReport;
using foodtag::Curve;
using foodtag::ReportData;
using Kind = flowtrain::StageShape::Kind;

namespace {

using flowtrain::testing::TempDir;

namespace fs = std::filesystem;

// The report's palette, in order: the teacher's colour, the student's; CPU cores take colours
// from the palette's end (core 0, core 1), which nothing else in the sample report uses.
constexpr const char* kTeacherColour = "#1f77b4";
constexpr const char* kStudentColour = "#ff7f0e";
constexpr const char* kCore0Colour = "#17becf";
constexpr const char* kCore1Colour = "#bcbd22";
constexpr const char* kBusyColour = "#2e7d32";

Curve curve(const std::string& name, int n, double (*f)(double), double x_step = 1) {
  Curve c{name, {}, {}};
  for (int i = 0; i < n; ++i) {
    c.x.push_back(i * x_step);
    c.y.push_back(f(i * x_step));
  }
  return c;
}

StageReport stage(const std::string& name,
                  Kind kind,
                  std::size_t workers,
                  std::size_t capacity,
                  double busy,
                  double starved,
                  double blocked) {
  StageReport s;
  s.name = name;
  s.kind = kind;
  s.concurrency = s.workers = workers;
  s.queue_capacity = capacity;
  s.items_in = kind == Kind::kSource ? 0 : 4000;
  s.items_out = kind == Kind::kSink ? 0 : 4000;
  s.busy_fraction = busy;
  s.busy_s = busy * 20 * static_cast<double>(workers);
  s.starved_fraction = starved;
  s.blocked_fraction = blocked;
  return s;
}

// Loss: the teacher's falls from 2.7 to 0.2 (exponentially), the student's rises from 0.3 to 2.0
// (a diverging run): opposite shapes the pixel test can tell apart.
std::vector<Curve> loss_curves() {
  Curve student = curve("student", 5000, [](double s) { return 0.3 + 1.7 * s / 5000; });
  student.y[1234] = std::numeric_limits<double>::quiet_NaN();  // a step whose loss was lost
  return {curve("teacher", 5000, [](double s) { return 0.2 + 2.5 * std::exp(-s / 800); }), student};
}

ReportData sample_report() {
  ReportData d;
  d.title = "foodtag <distil> & report";
  d.created = "2026-11-22 09:30 UTC";
  d.machine = "2 cores, 24 GiB, Debian 12";
  d.verdict = "'decode<jpeg>' is the bottleneck: raise \"concurrency\"";
  d.loss = loss_curves();
  d.accuracy = {
      {"teacher", {1, 2, 3, 4, 5}, {0.21, 0.42, 0.55, 0.64, 0.70}},
      {"student", {1, 2, 3, 4, 5}, {0.12, 0.26, 0.37, 0.46, 0.51}},
      {"teacher (validation)", {2, 4, 5}, {0.30, 0.45, 0.52}, /*dashed=*/true},
  };
  d.models = {{"teacher", 85'800'000, 327.4, 0.812, 0.951, 62.5, 58.25, 40, 45.2},
              {"student", 5'700'000, 22.1, 0.743, -1, 71.0, -1, 520, 4.1, 112}};
  d.comparisons = {"student against <baseline> on the same 112 photos: ..."};

  flowtrain::RunReport r;
  r.wall_s = 20;
  r.threads = r.cores = r.peak_threads = 2;
  r.stages = {stage("list_files", Kind::kSource, 1, 0, 0.02, 0, 0.9),
              stage("decode<jpeg>", Kind::kMap, 2, 8, 0.92, 0.03, 0.02),
              stage("augment", Kind::kMap, 1, 8, 0.35, 0.6, 0.0),
              stage("kd_train", Kind::kSink, 1, 4, 0.55, 0.42, 0)};
  for (int i = 0; i < 200; ++i) {
    const double t = i * 0.1;
    r.stages[1].queue_series.push_back({t, 7.0 + (i % 3 == 0 ? 1 : 0)});  // always nearly full
    r.stages[2].queue_series.push_back({t, 0.5 + 0.5 * std::sin(t)});
    r.stages[3].queue_series.push_back({t, 2 + 2 * std::sin(t / 3)});
  }
  for (StageReport& s : r.stages) {
    for (const flowtrain::QueueSample& q : s.queue_series)
      s.queue_max = std::max(s.queue_max, q.occupancy);
    s.queue_mean = s.queue_max / 2;
  }
  r.cpu.interval_s = 0.2;
  r.cpu.cores = {{}, {}};
  for (int i = 0; i < 100; ++i) {
    r.cpu.times_s.push_back(i * 0.2);
    r.cpu.cores[0].push_back(0.95 - 0.05 * (i % 2));
    r.cpu.cores[1].push_back(0.45 + 0.3 * std::sin(i * 0.2));
  }
  r.cpu.core_mean = {0.92, 0.45};
  r.cpu.process_cpu_s = 27.5;
  d.phases = {{"distill", r}};
  d.config_text =
      "phases:\n  distill:\n    stages: {decode: {concurrency: 2}}  # <b>not bold</b> & \"q\"\n";
  return d;
}

// Renders `html_path` with scripts/render-report; fails the test with the script's output if it
// could not (for one, when Chromium is missing).
cv::Mat render_png(const fs::path& html_path) {
  const fs::path png = fs::path(html_path).replace_extension(".png");
  const fs::path log = fs::path(html_path).replace_extension(".log");
  const std::string script = std::string(FLOWTRAIN_SOURCE_DIR) + "/scripts/render-report";
  const flowtrain::testing::Exit e = flowtrain::testing::wait_for(
      flowtrain::testing::spawn({script, html_path.string(), png.string()}, {}, log.string()), 90);
  REQUIRE_MESSAGE(e.code == 0,
                  "scripts/render-report failed (Chromium is installed by "
                  "scripts/install-deps: apt-get install chromium):\n"
                      << e.output);
  INFO("rendered " << png.string() << " in " << e.seconds << " s");
  cv::Mat image = cv::imread(png.string(), cv::IMREAD_COLOR);
  REQUIRE_MESSAGE(!image.empty(), "cannot read " << png.string());
  return image;
}

// The pixels of exactly this colour ("#rrggbb"): strokes and fills, not their anti-aliased edges.
std::vector<cv::Point> pixels_of(const cv::Mat& bgr, const std::string& colour) {
  const int rgb = std::stoi(colour.substr(1), nullptr, 16);
  const cv::Vec3b want(rgb & 0xff, (rgb >> 8) & 0xff, (rgb >> 16) & 0xff);
  std::vector<cv::Point> out;
  for (int y = 0; y < bgr.rows; ++y) {
    for (int x = 0; x < bgr.cols; ++x) {
      if (bgr.at<cv::Vec3b>(y, x) == want) out.emplace_back(x, y);
    }
  }
  return out;
}

// How a curve runs: the median row of its pixels in the left and in the right quarter of its
// width (rows grow downwards: a falling curve's right end has the larger row). The median leaves
// out the few pixels of its legend swatch.
struct Ends {
  double left_row = 0, right_row = 0;
  int width = 0;
};

Ends ends_of(const std::vector<cv::Point>& pixels) {
  int lo = std::numeric_limits<int>::max(), hi = 0;
  for (const cv::Point& p : pixels) {
    lo = std::min(lo, p.x);
    hi = std::max(hi, p.x);
  }
  const int quarter = (hi - lo) / 4;
  std::vector<int> left, right;
  for (const cv::Point& p : pixels) {
    if (p.x <= lo + quarter) left.push_back(p.y);
    if (p.x >= hi - quarter) right.push_back(p.y);
  }
  auto median = [](std::vector<int>& rows) {
    std::nth_element(rows.begin(), rows.begin() + rows.size() / 2, rows.end());
    return static_cast<double>(rows[rows.size() / 2]);
  };
  return {median(left), median(right), hi - lo};
}

// The coordinates of every polyline: numbers only (a NaN or an infinity would show as letters).
std::vector<std::string> polyline_points(const std::string& html) {
  // A plain scan: std::regex recurses per character and overflows the stack on long attributes.
  std::vector<std::string> out;
  for (std::size_t at = html.find("<polyline"); at != std::string::npos;
       at = html.find("<polyline", at + 1)) {
    const std::size_t end = html.find('>', at);
    const std::size_t begin = html.find(" points=\"", at);
    if (begin == std::string::npos || begin > end) continue;
    const std::size_t first = begin + 9;
    out.push_back(html.substr(first, html.find('"', first) - first));
  }
  return out;
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("Foodtag.Report.SectionsInOrderAndEscaped") {
  const std::string html = foodtag::render_html(sample_report());

  std::size_t at = 0;
  for (const char* part : {"<header>", "class=\"verdict\"", "id=\"models\"", "id=\"loss-chart\"",
                           "id=\"accuracy-chart\"", "id=\"top1-chart\"", "id=\"phase-0\"",
                           "id=\"utilisation-chart-0\"", "id=\"queue-chart-0\"",
                           "id=\"cpu-chart-0\"", "class=\"stages\"", "id=\"config\"", "<pre>"}) {
    const std::size_t found = html.find(part, at);
    CHECK_MESSAGE(found != std::string::npos, part << " missing or out of order");
    if (found != std::string::npos) at = found;
  }
  // Text is escaped everywhere: title, verdict, stage names in charts and table, config.
  CHECK(html.find("<title>foodtag &lt;distil&gt; &amp; report</title>") != std::string::npos);
  CHECK(
      html.find("&#39;decode&lt;jpeg&gt;&#39; is the bottleneck: raise &quot;concurrency&quot;") !=
      std::string::npos);
  CHECK(count(html, "decode&lt;jpeg&gt;") >= 4);  // verdict, utilisation, queue legend, table
  CHECK(html.find("decode<jpeg>") == std::string::npos);
  CHECK(html.find("# &lt;b&gt;not bold&lt;/b&gt; &amp; &quot;q&quot;") != std::string::npos);
  // Self-contained: nothing fetched, nothing run.
  CHECK(html.find("http") == std::string::npos);
  CHECK(html.find("<script") == std::string::npos);
  CHECK(html.find("<link") == std::string::npos);
  CHECK(html.find("url(") == std::string::npos);
  // The models table: measured values, "–" for the student's unmeasured top-5 and energy from
  // its group, the ratios.
  CHECK(html.find("<td>85.80 M</td><td>327.4</td><td>81.2%</td><td>95.1%</td><td>62.5</td>"
                  "<td>58.2</td><td>40.0</td><td>45.20</td>") != std::string::npos);
  // The student's top-1 was measured on 112 photos: its 95% interval (Wilson's, of 83 right).
  CHECK(html.find("<td>74.3% (65.3-81.3)</td><td>–</td><td>71.0</td><td>–</td>") !=
        std::string::npos);
  CHECK(html.find("<li>student against &lt;baseline&gt; on the same 112 photos: ...</li>") !=
        std::string::npos);
  CHECK(html.find("<td>13.0×</td><td>0.09×</td>") != std::string::npos);  // images/s, ms/image
  // The phase: its verdict and layout lines, items/s, CPU means in the legend.
  CHECK(html.find("busy 92% of its 2 workers") != std::string::npos);
  CHECK(html.find("2 cores: 2 graph threads") != std::string::npos);
  CHECK(html.find("200 items/s") != std::string::npos);
  CHECK(html.find("core 0 (mean 92%)") != std::string::npos);
  CHECK(html.find("(cap 8)") != std::string::npos);
  CHECK(html.find("stroke-dasharray") != std::string::npos);  // the capacities
  // The validation curve: dashed, in the teacher's colour, named in the legend.
  CHECK(html.find("<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"2\" "
                  "stroke-linejoin=\"round\" stroke-dasharray=\"7 4\" points=") !=
        std::string::npos);
  CHECK(html.find(">teacher (validation)<") != std::string::npos);
}

TEST_CASE("Foodtag.Report.CurvesDownsampledAndNaNSkipped") {
  const std::string html = foodtag::render_html(sample_report());
  const std::vector<std::string> lines = polyline_points(html);
  // loss x2, accuracy x3, queues x3, cores x2
  REQUIRE(lines.size() == 10);
  for (const std::string& points : lines) {
    CHECK(points.find_first_not_of("0123456789.,- ") == std::string::npos);
    CHECK(count(points, ",") <= 1000);
  }
  CHECK(count(lines[0], ",") >= 500);  // 5000 steps kept as a dense band, not a few points
}

TEST_CASE("Foodtag.Report.DegenerateDataGetsNotesNotBrokenCharts") {
  ReportData empty;
  const std::string nothing = foodtag::render_html(empty);
  CHECK(nothing.find("no loss recorded") != std::string::npos);
  CHECK(nothing.find("no accuracy recorded") != std::string::npos);
  CHECK(nothing.find("no validation accuracy measured") != std::string::npos);
  CHECK(nothing.find("no models measured") != std::string::npos);
  CHECK(nothing.find("<svg") == std::string::npos);
  CHECK(nothing.find("id=\"config\"") != std::string::npos);

  ReportData odd;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  odd.loss = {{"single", {3}, {0.5}}, {"flat", {0, 1, 2}, {2, 2, 2}}, {"lost", {0, 1}, {nan, nan}}};
  odd.accuracy = {{"lost too", {1}, {nan}}};
  flowtrain::RunReport r;  // no stages, no samples, no CPU
  odd.phases = {{"idle", r}};
  const std::string html = foodtag::render_html(odd);
  CHECK(html.find("id=\"loss-chart\"") != std::string::npos);
  CHECK(html.find("<circle") != std::string::npos);  // the single point shows as a dot
  CHECK(html.find("no accuracy recorded") != std::string::npos);
  CHECK(html.find("no stages") != std::string::npos);
  CHECK(html.find("no queue samples") != std::string::npos);
  CHECK(html.find("cpu-chart") == std::string::npos);
  CHECK(html.find("no stage did any work") != std::string::npos);
  for (const std::string& points : polyline_points(html)) {
    CHECK(points.find_first_not_of("0123456789.,- ") == std::string::npos);
  }
  CHECK(html.find("nan") == std::string::npos);
  CHECK(html.find("inf") == std::string::npos);
}

TEST_CASE("Foodtag.Report.WrittenAtomicallyOrNamesThePath") {
  TempDir dir;
  const std::string path = (dir.path() / "report.html").string();
  foodtag::write_html_report(sample_report(), path);
  CHECK(flowtrain::testing::read_text(path) == foodtag::render_html(sample_report()));
  CHECK_FALSE(fs::exists(path + ".tmp"));

  const std::string missing = (dir.path() / "no-such-dir" / "report.html").string();
  CHECK_THROWS_WITH_AS(foodtag::write_html_report(sample_report(), missing),
                       ("cannot write " + missing + ": cannot create " + missing +
                        ".tmp (No such file or directory)")
                           .c_str(),
                       flowtrain::Error);
}

TEST_CASE("Foodtag.Report.ChromiumDrawsTheCharts" * doctest::timeout(120)) {
  TempDir dir;
  const fs::path html = dir.path() / "report.html";
  foodtag::write_html_report(sample_report(), html.string());
  const cv::Mat png = render_png(html);

  // Teacher and student: two loss curves, two accuracy curves, a bar each (and two queue lines).
  CHECK(pixels_of(png, kTeacherColour).size() > 2000);
  CHECK(pixels_of(png, kStudentColour).size() > 2000);
  // Only the CPU chart draws in the cores' colours.
  CHECK(pixels_of(png, kCore0Colour).size() > 500);
  CHECK(pixels_of(png, kCore1Colour).size() > 500);
  // The utilisation bars: 'decode' is busy most of its 92%-wide bar.
  CHECK(pixels_of(png, kBusyColour).size() > 5000);
}

TEST_CASE("Foodtag.Report.FitsTwelveHundredPixelsWithItsUnitsAndRunTime" * doctest::timeout(120)) {
  ReportData d = sample_report();
  d.phases[0].report.stages[1].item = "Sample";  // decode: images
  d.phases[0].report.stages[3].item = "Batch";
  d.phases.push_back(d.phases[0]);  // two phases of 20 s
  d.phases[1].name = "baseline";
  const std::string html = foodtag::render_html(d);
  CHECK(html.find("<b>run time 40s</b> (distill, baseline)") != std::string::npos);
  CHECK(html.find("images/s") != std::string::npos);
  CHECK(html.find("batches/s") != std::string::npos);
  CHECK(html.find("<th>rate (per s)</th>") != std::string::npos);
  // Laid out by Chromium in a 1,200 px window, no element reaches past its right edge.
  TempDir dir;
  const fs::path path = dir.path() / "report.html";
  foodtag::write_html_report(d, path.string());
  const flowtrain::testing::Exit e = flowtrain::testing::wait_for(
      flowtrain::testing::spawn(
          {std::string(FLOWTRAIN_SOURCE_DIR) + "/scripts/report-overflow", path.string(), "1200"},
          {}, (dir.path() / "overflow.log").string()),
      90);
  CHECK_MESSAGE(e.code == 0, e.output);
  CHECK(e.output.find("fits 1200 px") != std::string::npos);
}

TEST_CASE("Foodtag.Report.ChromiumDrawsTheCurveShapes" * doctest::timeout(120)) {
  // Only the loss chart: every pixel of the two colours is in it (or in its legend).
  ReportData d;
  d.loss = loss_curves();
  TempDir dir;
  const fs::path html = dir.path() / "loss.html";
  foodtag::write_html_report(d, html.string());
  const cv::Mat png = render_png(html);

  const std::vector<cv::Point> teacher = pixels_of(png, kTeacherColour);
  const std::vector<cv::Point> student = pixels_of(png, kStudentColour);
  REQUIRE(teacher.size() > 300);
  REQUIRE(student.size() > 300);
  const Ends t = ends_of(teacher), s = ends_of(student);
  INFO("teacher rows " << t.left_row << " -> " << t.right_row << " over " << t.width << " px");
  INFO("student rows " << s.left_row << " -> " << s.right_row << " over " << s.width << " px");
  // Both span the plot (about 470 px wide), not a legend swatch.
  CHECK(t.width > 400);
  CHECK(s.width > 400);
  // The teacher's loss falls far (2.7 -> 0.2), the student's rises (0.3 -> 2.0): each by more
  // than a quarter of the plot's 250 px height between the ends.
  CHECK(t.right_row - t.left_row > 60);
  CHECK(s.left_row - s.right_row > 60);
}
