#pragma once

#include <chrono>
#include <iosfwd>
#include <string>
#include <vector>

namespace flowtrain::dist {

/// A job of `nproc` ranks on this machine, as `flowtrain run --nproc N` starts it.
struct LaunchOptions {
  int nproc = 1;
  std::string program;                     // the executable each rank runs
  std::vector<std::string> args;           // its argv, argv[0] first
  std::chrono::milliseconds grace{10000};  // after SIGTERM, before SIGKILL
};

/// Starts `nproc` copies of `program` as ranks 0..nproc-1 (RANK, WORLD_SIZE, LOCAL_RANK,
/// MASTER_ADDR=127.0.0.1, MASTER_PORT=a free port; each in its own process group), forwards
/// SIGINT and SIGTERM to them, and waits for all. When a rank fails (a non-zero exit or a
/// signal) it says so on `err`, "flowtrain: rank 1 exited with code 3; stopping the other
/// ranks", and stops the others: SIGTERM, then SIGKILL after `grace`.
/// Returns 0 if every rank succeeded, else the first failed rank's exit code (128 + the signal
/// number if it was killed). Throws Error if a rank cannot be started.
///
///   return launch_local({.nproc = 2, .program = "/proc/self/exe", .args = argv}, std::cerr);
int launch_local(const LaunchOptions& options, std::ostream& err);

/// argv without its `--nproc N` / `--nproc=N`: the command line each rank of a local job runs.
std::vector<std::string> args_without_nproc(int argc, char** argv);

/// A TCP port on 127.0.0.1 that a listener can bind now and no neighbour takes before it does:
/// below the kernel's ephemeral range (which connect() and port 0 draw from), and held for this
/// process's life by a lock in /tmp/flowtrain-ports that every flowtrain process (and the test
/// scripts' free_ports) respects. Where no lock can be made: the kernel's pick of a free one.
int free_local_port();

/// In a rank started by launch_local: asks the kernel to send it SIGTERM when the launcher dies
/// (even by SIGKILL), so that no rank outlives its job. Does nothing in other processes.
void exit_with_launcher();

}  // namespace flowtrain::dist
