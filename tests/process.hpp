#pragma once

// Child processes for the multi-process tests: started with posix_spawn (never fork() in a
// process with threads), output captured to a file, waited for with a deadline.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace flowtrain::testing {

struct Process {
  pid_t pid = 0;
  std::string log;  // stdout and stderr
  std::chrono::steady_clock::time_point started;
};

struct Exit {
  int code = -1;   // exit code, or -1 if killed by a signal
  int signal = 0;  // the signal that ended it
  bool timed_out = false;
  double seconds = 0;  // from start to exit
  std::string output;
};

/// Starts `argv` with this environment plus `env` ("NAME=value", replacing), output to `log`.
inline Process spawn(const std::vector<std::string>& argv,
                     const std::vector<std::string>& env,
                     const std::string& log) {
  std::vector<std::string> all;
  for (char** e = environ; *e; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('=') + 1);
    bool replaced = false;
    for (const std::string& o : env) replaced = replaced || o.rfind(name, 0) == 0;
    if (!replaced) all.push_back(entry);
  }
  all.insert(all.end(), env.begin(), env.end());
  std::vector<std::string> args = argv;
  std::vector<char*> argp, envp;
  for (std::string& a : args) argp.push_back(a.data());
  argp.push_back(nullptr);
  for (std::string& e : all) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  Process p;
  p.log = log;
  p.started = std::chrono::steady_clock::now();
  const int rc = posix_spawn(&p.pid, args[0].c_str(), &actions, nullptr, argp.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) throw std::runtime_error("cannot start " + args[0] + ": " + std::strerror(rc));
  return p;
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

/// Waits for `p` to end, at most `timeout_s` (then kills it and says so).
inline Exit wait_for(const Process& p, double timeout_s) {
  Exit e;
  const auto deadline = p.started + std::chrono::duration<double>(timeout_s);
  int status = 0;
  while (waitpid(p.pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() >= deadline) {
      e.timed_out = true;
      kill(p.pid, SIGKILL);
      waitpid(p.pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  e.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - p.started).count();
  if (WIFEXITED(status)) e.code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) e.signal = WTERMSIG(status);
  e.output = read_text(p.log);
  std::remove(p.log.c_str());
  return e;
}

}  // namespace flowtrain::testing
