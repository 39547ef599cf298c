#pragma once

// A RunReport saved as YAML beside a run's outputs, and read back (for a later HTML report, a
// comparison of runs, or a dashboard): every field round-trips, so the verdict, layout and
// format_report of the read-back report are the original's. The same fields as JSON, for
// scripts, dashboards and Python (written only: YAML is the format that reads back).

#include <string>
#include <vector>

#include "graph/report.hpp"

namespace flowtrain {

/// The report as a YAML document (a map with `flowtrain_report: 1` first).
///   std::string text = report_to_yaml(report);
std::string report_to_yaml(const RunReport& report);

/// The report as one JSON object on one line (and a newline): the same fields as
/// report_to_yaml (the marker `"flowtrain_report": 1` first, `waiting` only for a stage that
/// waited, `autotune` only for a tuned run), plus `"verdict"`: RunReport::verdict(), which the
/// YAML leaves to its reader to compute. JSON has no inf or nan: such a number is written as
/// null. Numbers are the shortest text that reads back as the same double; strings are UTF-8 (a
/// byte that is not is written as U+FFFD).
///   {"flowtrain_report":1,"wall_s":2.31,...,"stages":[{"name":"decode",...,"results":[]},...],
///    "cpu":{...},"verdict":"'decode' is the bottleneck ..."}
///   std::string text = report_to_json(report);
std::string report_to_json(const RunReport& report);

/// What a run of phases was, beside its reports (run_report_json).
struct RunReportInfo {
  std::string config;                  // the config file, as given
  std::vector<std::string> overrides;  // key.path=value, as given
  std::string stopped;                 // "SIGINT during phase distill"; empty: ran to the end
};

/// A run of phases as one JSON document on one line (`flowtrain run --report FILE.json`):
///   {"flowtrain_report": 1, "config": "kd.yaml", "overrides": ["threads=1"],
///    "stopped": null or "SIGINT during phase distill",
///    "phases": [{"phase": "teacher", ...the fields of report_to_json but its marker...}, ...]}
/// "phase" is the name in the report's key_prefix ("phases.teacher."), null for a config of one
/// pipeline (no phases).
///   const std::string text = run_report_json(outcome.reports, {path, overrides, stopped});
std::string run_report_json(const std::vector<RunReport>& phases, const RunReportInfo& info);

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
