#pragma once

// A RunReport saved as YAML beside a run's outputs, and read back (for a later HTML report, a
// comparison of runs, or a dashboard): every field round-trips, so the verdict, layout and
// format_report of the read-back report are the original's.

#include <string>

#include "graph/report.hpp"

namespace flowtrain {

/// The report as a YAML document (a map with `flowtrain_report: 1` first).
///   std::string text = report_to_yaml(report);
std::string report_to_yaml(const RunReport& report);

/// Parses what report_to_yaml wrote. Throws Error prefixed with `origin` (and the line, where
/// known) if the text is not YAML, not a run report, or a field has the wrong type. Fields it
/// lacks keep their defaults.
///   RunReport again = report_from_yaml(text, "distill.report.yaml");
RunReport report_from_yaml(const std::string& text, const std::string& origin);

/// Writes report_to_yaml(report) to `path` with write_file_atomically. Throws Error naming the
/// path if it cannot.
///   write_report_file(report, "runs/7/distill.report.yaml");
void write_report_file(const RunReport& report, const std::string& path);

/// Reads a file written by write_report_file. Throws Error naming the path if it is missing,
/// unreadable or not a run report.
///   const RunReport report = read_report_file("runs/7/distill.report.yaml");
RunReport read_report_file(const std::string& path);

}  // namespace flowtrain
