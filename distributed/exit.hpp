#pragma once

// A process's exit as a rank of a job: its error line, what it tells the other ranks, and
// leaving at once, without waiting on peers that may be dead or hung.

#include <exception>
#include <string>

namespace flowtrain::dist {

/// "rank 1: " when this process is a rank of a job (World::current(), else the launcher's
/// environment), else "": the prefix of this process's error lines.
std::string rank_prefix();

/// An app's last words on an error: prints "`program`: error: rank 1: <first line of what>"
/// to stderr and returns 1; as a rank of a job it first tells the other ranks (report_failure),
/// adds which rank is to blame when another one is (diagnose), and ends the process at once
/// (std::_Exit: the process group's destructor could wait on dead or hung peers).
///
///   catch (const std::exception& e) { return flowtrain::dist::exit_on_error(e, "flowtrain"); }
int exit_on_error(const std::exception& e, const std::string& program);

/// Ends a rank that cannot leave its job in order (stopped early, peers unknown): flushes the
/// standard streams and std::_Exit(code), without tearing down the process group.
[[noreturn]] void leave_now(int code);

}  // namespace flowtrain::dist
