#pragma once

// The foodtag commands: each loads the config (with the app's own sections), checks what it
// needs before it starts, and does its part of the run.

#include <string>
#include <vector>

namespace foodtag {

/// One command line: the config, its overrides, and predict's arguments.
struct Invocation {
  std::string config_path;
  std::vector<std::string> overrides;
  std::vector<std::string> images;  // predict (a key.path=value among them is an override)
  std::string model;                // predict: "" = OUTPUT/student.pt
  int top = 3;                      // predict
};

/// Runs "prepare", "train-teacher", "distill", "eval", "export", "report", "predict" or "run".
/// Returns the exit code; throws flowtrain::Error with one line for any problem.
int run_command(const std::string& command, Invocation in);

/// The app's config sections (data, output, report) as text or a Markdown table.
std::string keys_text(bool markdown);

}  // namespace foodtag
