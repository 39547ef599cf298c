#pragma once

// Child processes for the multi-process tests, through graph/child_process.hpp: output captured
// to a file, waited for with a deadline.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "graph/child_process.hpp"

namespace flowtrain::testing {

struct Process : Child {
  std::string log;  // stdout and stderr
};

struct Exit : ChildExit {
  std::string output;
};

/// Starts `argv` with this environment plus `env` ("NAME=value", replacing), output to `log`.
inline Process spawn(const std::vector<std::string>& argv,
                     const std::vector<std::string>& env,
                     const std::string& log) {
  return {start_child(argv, {.env = env, .output = log}), log};
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

/// Waits for `p` to end, at most `timeout_s` (then kills it and says so).
inline Exit wait_for(const Process& p, double timeout_s) {
  Exit e{wait_child(p, timeout_s), read_text(p.log)};
  std::remove(p.log.c_str());
  return e;
}

}  // namespace flowtrain::testing
