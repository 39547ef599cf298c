#include "distributed/launch.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "graph/child_process.hpp"
#include "graph/error.hpp"

namespace flowtrain::dist {

namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kLauncherPidVariable = "FLOWTRAIN_LAUNCHER_PID";

// Where free_local_port's locks are: one file a port, locked (flock) by the process holding it.
// scripts/launcher-job.sh's free_ports takes the same locks.
constexpr const char* kPortLocks = "/tmp/flowtrain-ports";

// Binds a socket to `port` of 127.0.0.1 (0: the kernel picks one), with SO_REUSEADDR as c10d's
// store binds (a connection of an earlier job in TIME_WAIT does not keep a port), and closes
// it: the port bound, or -1 with errno set.
int bind_loopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  const int on = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<std::uint16_t>(port));
  socklen_t length = sizeof address;
  const bool bound = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
                     getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
  const int error = errno;
  close(fd);
  errno = error;
  return bound ? ntohs(address.sin_port) : -1;
}

std::atomic<int> g_signal{0};  // the last SIGINT/SIGTERM the launcher received, to forward

extern "C" void remember_signal(int signal) { g_signal.store(signal); }

Child spawn_rank(const LaunchOptions& options, int rank, int port) {
  ChildOptions child{.program = options.program,
                     .env = {"RANK=" + std::to_string(rank),
                             "WORLD_SIZE=" + std::to_string(options.nproc),
                             "LOCAL_RANK=" + std::to_string(rank),
                             "LOCAL_WORLD_SIZE=" + std::to_string(options.nproc),
                             "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(port),
                             std::string(kLauncherPidVariable) + "=" + std::to_string(getpid())},
                     // Each rank in its own process group: a terminal's Ctrl-C reaches the
                     // launcher only, which forwards it once (a second SIGINT would end a rank
                     // without its report).
                     .own_group = true};
  try {
    return start_child(options.args, child);
  } catch (const SpawnError& e) {
    throw Error("cannot start rank " + std::to_string(rank) + " (" + options.program +
                "): " + std::strerror(e.error));
  }
}

}  // namespace

int launch_local(const LaunchOptions& options, std::ostream& err) {
  if (options.nproc < 1) throw Error("--nproc must be at least 1");
  const int port = free_local_port();

  struct sigaction action {};
  action.sa_handler = remember_signal;
  sigemptyset(&action.sa_mask);
  struct sigaction previous_int {};
  struct sigaction previous_term {};
  sigaction(SIGINT, &action, &previous_int);
  sigaction(SIGTERM, &action, &previous_term);
  g_signal.store(0);

  std::vector<Child> running;
  auto stop_all = [&](int signal) {
    for (const Child& child : running) kill(-child.pid, signal);
  };
  std::vector<int> rank_of_pid_index;  // running[i] is rank ranks[i]
  try {
    for (int rank = 0; rank < options.nproc; ++rank) {
      running.push_back(spawn_rank(options, rank, port));
      rank_of_pid_index.push_back(rank);
    }
  } catch (...) {
    stop_all(SIGKILL);
    for (const Child& child : running) wait_child(child);
    sigaction(SIGINT, &previous_int, nullptr);
    sigaction(SIGTERM, &previous_term, nullptr);
    throw;
  }

  int result = 0;
  bool forwarded = false;  // the user asked the job to stop: non-zero exits are expected
  Clock::time_point kill_at = Clock::time_point::max();  // of the stragglers
  while (!running.empty()) {
    if (const int signal = g_signal.exchange(0)) {
      stop_all(signal);
      forwarded = true;
    }
    for (std::size_t i = 0; i < running.size();) {
      const std::optional<ChildExit> exit = poll_child(running[i]);
      if (!exit) {
        ++i;
        continue;
      }
      const int rank = rank_of_pid_index[i];
      running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
      rank_of_pid_index.erase(rank_of_pid_index.begin() + static_cast<std::ptrdiff_t>(i));
      const int code = exit->status();
      if (code == 0 || result != 0) continue;
      result = code;
      if (!forwarded) {
        err << "flowtrain: rank " << rank
            << (exit->signal != 0 ? " was killed by signal " + std::to_string(exit->signal) +
                                        " (" + strsignal(exit->signal) + ")"
                                  : " exited with code " + std::to_string(code))
            << (running.empty() ? "" : "; stopping the other ranks") << std::endl;
      }
      stop_all(SIGTERM);
      kill_at = Clock::now() + options.grace;
    }
    if (Clock::now() >= kill_at) {
      stop_all(SIGKILL);
      kill_at = Clock::time_point::max();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  sigaction(SIGINT, &previous_int, nullptr);
  sigaction(SIGTERM, &previous_term, nullptr);
  return result;
}

int free_local_port() {
  // The kernel's ephemeral range (ip_local_port_range), from which bind(port 0) and every
  // connect() take ports: one picked there may be handed to a neighbour's connection before the
  // job binds it. Below it only a listener takes a port, and the lock keeps other flowtrain
  // processes (a test suite run in parallel) off it.
  int ephemeral_low = 32768;
  if (std::FILE* range = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(range, "%d", &ephemeral_low) != 1) ephemeral_low = 32768;
    std::fclose(range);
  }
  constexpr int kLowest = 20000;
  const int span = std::max(ephemeral_low, kLowest + 1000) - kLowest;
  ::mkdir(kPortLocks, 01777);
  std::mt19937 random(static_cast<std::uint32_t>(getpid()) ^
                      static_cast<std::uint32_t>(Clock::now().time_since_epoch().count()));
  const int start = static_cast<int>(random() % static_cast<std::uint32_t>(span));
  for (int i = 0; i < span; ++i) {
    const int port = kLowest + (start + i) % span;
    if (port >= 29400 && port < 29600) continue;  // torchrun's defaults (29400, 29500) and kin
    const std::string lock = std::string(kPortLocks) + "/" + std::to_string(port);
    const int held = ::open(lock.c_str(), O_RDONLY | O_CREAT | O_CLOEXEC, 0666);
    if (held < 0) break;  // no lock folder: as before, the kernel's pick
    if (::flock(held, LOCK_EX | LOCK_NB) != 0 || bind_loopback(port) < 0) {
      ::close(held);
      continue;
    }
    return port;  // `held` stays open: the lock lasts as long as this process
  }
  const int port = bind_loopback(0);
  if (port < 0) {
    throw Error(std::string("cannot find a free port on 127.0.0.1: ") + std::strerror(errno));
  }
  return port;
}

void exit_with_launcher() {
  const char* launcher = std::getenv(kLauncherPidVariable);
  if (!launcher) return;
  const pid_t launcher_pid = static_cast<pid_t>(std::atoi(launcher));
  unsetenv(kLauncherPidVariable);  // not for this rank's own child processes
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  // The launcher may have died before the line above.
  if (getppid() != launcher_pid) raise(SIGTERM);
}

std::vector<std::string> args_without_nproc(int argc, char** argv) {
  std::vector<std::string> args;
  for (int i = 0; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--nproc") {
      ++i;  // and its value
    } else if (arg.rfind("--nproc=", 0) != 0) {
      args.push_back(arg);
    }
  }
  return args;
}

}  // namespace flowtrain::dist
