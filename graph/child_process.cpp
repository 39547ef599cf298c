#include "graph/child_process.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

extern char** environ;

namespace flowtrain {

namespace {

using Clock = std::chrono::steady_clock;

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

ChildExit exit_of(const Child& child, int status) {
  ChildExit e;
  if (WIFEXITED(status)) e.code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) e.signal = WTERMSIG(status);
  e.seconds = std::chrono::duration<double>(Clock::now() - child.started).count();
  return e;
}

}  // namespace

Child start_child(const std::vector<std::string>& argv, const ChildOptions& options) {
  if (argv.empty()) throw SpawnError("cannot start a program: no program given", EINVAL);
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('=') + 1);
    bool replaced = false;
    for (const std::string& o : options.env) replaced = replaced || o.starts_with(name);
    if (!replaced) env.push_back(entry);
  }
  env.insert(env.end(), options.env.begin(), options.env.end());
  std::vector<std::string> args = argv;
  const std::vector<char*> argp = pointers(args);
  const std::vector<char*> envp = pointers(env);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (options.null_input) posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  constexpr int kCreate = O_WRONLY | O_CREAT | O_TRUNC;
  if (!options.output.empty()) {
    posix_spawn_file_actions_addopen(&actions, 1, options.output.c_str(), kCreate, 0644);
  }
  if (!options.errors.empty()) {
    posix_spawn_file_actions_addopen(&actions, 2, options.errors.c_str(), kCreate, 0644);
  } else if (!options.output.empty()) {
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
  }
  if (!options.cwd.empty()) posix_spawn_file_actions_addchdir_np(&actions, options.cwd.c_str());
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  if (options.own_group) {
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attr, 0);
  }
  const std::string& program = options.program.empty() ? argv[0] : options.program;
  Child child;
  child.started = Clock::now();
  const int rc = (options.search_path ? posix_spawnp : posix_spawn)(
      &child.pid, program.c_str(), &actions, &attr, argp.data(), envp.data());
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) throw SpawnError("cannot start " + program + ": " + std::strerror(rc), rc);
  return child;
}

std::optional<ChildExit> poll_child(const Child& child) {
  int status = 0;
  pid_t done = 0;
  do {
    done = ::waitpid(child.pid, &status, WNOHANG);
  } while (done < 0 && errno == EINTR);
  if (done == 0) return std::nullopt;
  if (done < 0) return ChildExit{.seconds = exit_of(child, 0).seconds};  // reaped elsewhere
  return exit_of(child, status);
}

ChildExit wait_child(const Child& child, double timeout_s) {
  const auto deadline = timeout_s >= 1e9
                            ? Clock::time_point::max()
                            : child.started + std::chrono::duration_cast<Clock::duration>(
                                                  std::chrono::duration<double>(timeout_s));
  for (;;) {
    if (std::optional<ChildExit> e = poll_child(child)) return *e;
    if (Clock::now() >= deadline) {
      ::kill(child.pid, SIGKILL);
      int status = 0;
      while (::waitpid(child.pid, &status, 0) < 0 && errno == EINTR) {
      }
      ChildExit e = exit_of(child, status);
      e.timed_out = true;
      return e;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace flowtrain
