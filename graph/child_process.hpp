#pragma once

// The one way flowtrain starts another program (the local launcher's ranks, foodtag's npm and
// tar, the multi-process tests): posix_spawn, never fork() in a process that has threads.

#include <sys/types.h>

#include <chrono>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "graph/error.hpp"

namespace flowtrain {

struct ChildOptions {
  std::string program;           // the file to run (empty: argv[0])
  std::vector<std::string> env;  // "NAME=value", added to this process's environment (replacing)
  std::string cwd;               // empty: this process's
  std::string output;            // file for stdout, and stderr unless `errors` (empty: inherited)
  std::string errors;            // file for stderr (empty: as `output`)
  bool null_input = false;       // stdin from /dev/null (else inherited)
  bool own_group = false;        // a process group of its own (a terminal's Ctrl-C misses it)
  bool search_path = false;      // argv[0] looked up in PATH
};

/// A started program. A plain value: copy it, wait for it once.
struct Child {
  pid_t pid = 0;
  std::chrono::steady_clock::time_point started;
};

struct ChildExit {
  int code = -1;           // exit code, or -1 if a signal ended it
  int signal = 0;          // the signal that ended it
  bool timed_out = false;  // wait_child's timeout passed, and it was killed
  double seconds = 0;      // from start to exit
  /// As a shell reports it: the exit code, or 128 + the signal.
  int status() const { return signal != 0 ? 128 + signal : code; }
};

/// Thrown when the program cannot be started; `error` is posix_spawn's errno (ENOENT: no such
/// program).
struct SpawnError : Error {
  SpawnError(const std::string& what, int error_number) : Error(what), error(error_number) {}
  int error;
};

/// Starts `argv` (argv[0] the program unless options.program). Throws SpawnError("cannot start
/// PROGRAM: reason").
///   const Child c = start_child({"tar", "-xzf", path}, {.cwd = dir, .search_path = true});
///   const ChildExit e = wait_child(c, 60);
Child start_child(const std::vector<std::string>& argv, const ChildOptions& options = {});

/// The exit of `child` if it has ended (and it is reaped), without waiting.
std::optional<ChildExit> poll_child(const Child& child);

/// Waits for `child` to end, at most `timeout_s`; then kills it (SIGKILL) and says so.
ChildExit wait_child(const Child& child,
                     double timeout_s = std::numeric_limits<double>::infinity());

}  // namespace flowtrain
