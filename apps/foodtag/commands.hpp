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
  int nproc = 0;          // train-teacher, distill, eval, run: ranks of a local data-parallel job
  double timeout_s = 300;  // how long a rank waits for the others
  std::string program;     // this executable, to start the ranks of --nproc
  int folds = 0;           // cv (default 5), sweep (0: the run's own split)
};

/// Runs "prepare", "train-teacher", "distill", "baseline", "eval", "export", "report", "sweep",
/// "predict", "config" or "run".
/// Returns the exit code; throws flowtrain::Error with one line for any problem.
int run_command(const std::string& command, Invocation in);

/// Checks what `command` needs (config, data, models, output folder) without running it: the
/// launcher of --nproc calls it so that a mistake is said once, not once per rank. Returns false,
/// having said why in one line, when there is nothing to run (train-teacher with teacher.model).
bool check_command(const std::string& command, const Invocation& in);

/// The app's config sections (data, output, sweep, teacher, student, report) as text or a
/// Markdown table.
std::string keys_text(bool markdown);

}  // namespace foodtag
