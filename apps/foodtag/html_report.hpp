#pragma once

// The self-contained HTML report of a foodtag run: inline SVG charts, no scripts, no network.

#include <cstdint>
#include <string>
#include <vector>

#include "apps/foodtag/svg_chart.hpp"
#include "graph/report.hpp"

namespace foodtag {

/// What one model is and how well and fast it does.
struct ModelFacts {
  std::string name;             // "teacher", "student"
  std::int64_t parameters = 0;
  double file_mb = 0;           // TorchScript file size
  double top1 = -1, top5 = -1;  // validation accuracy 0..1 (-1: not measured)
  double mae_kcal = -1;         // validation mean absolute error of the energy estimate
  double mae_group_kcal = -1;   // ... of the median energy of the predicted group instead
  double images_per_s = 0;      // inference throughput (batch inference on this machine)
  double ms_per_image = 0;      // latency of one image at batch 1
  std::uint64_t validation_images = 0;  // photos top1 was measured on (0: unknown; with it the
                                        // top-1 cell shows its 95% interval)
};

/// One phase's profile (the RunReport of its pipeline).
struct PhaseProfile {
  std::string name;  // "teacher", "distill", ...
  flowtrain::RunReport report;
};

/// Everything the report shows.
struct ReportData {
  std::string title = "foodtag run";
  std::string created;  // "2026-11-22 09:30 UTC"
  std::string machine;  // "2 cores, 24 GiB, Debian 12"
  std::vector<Curve> loss;      // training loss per step, one curve per model
  std::vector<Curve> accuracy;  // top-1 by step: training per epoch, validation (dashed)
  std::vector<ModelFacts> models;
  std::vector<PhaseProfile> phases;
  std::string verdict;        // the profiler's one-line verdict for the distillation phase
  /// Models compared photo by photo (PairedComparison::text(), compare.hpp); may be empty.
  std::vector<std::string> comparisons;
  /// `foodtag sweep`'s table (sweep.csv): a header row, then one row per student; may be empty.
  std::vector<std::vector<std::string>> sweep;
  std::string config_text;    // the effective config (shown in a <pre>)
};

/// The whole report as one HTML document (charts as inline SVG; text escaped).
std::string render_html(const ReportData& data);

/// Writes render_html(data) to `path` with write_file_atomically.
/// Throws flowtrain::Error naming the path if it cannot.
void write_html_report(const ReportData& data, const std::string& path);

}  // namespace foodtag
