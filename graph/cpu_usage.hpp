#pragma once

// How busy each core of the machine is during a run (Linux /proc/stat), and how much CPU time
// this process used: the `cpu` part of a RunReport. Internal to graph/; the pipeline's sampler
// thread drives it.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "graph/metrics.hpp"
#include "graph/report.hpp"

namespace flowtrain::detail {

/// Cumulative time of one core since boot, in clock ticks (a line `cpuN ...` of /proc/stat).
struct CoreTicks {
  std::uint64_t busy = 0;   // total minus idle and iowait
  std::uint64_t total = 0;  // user nice system idle iowait irq softirq steal
};

/// The per-core lines of a /proc/stat file, in core order; std::nullopt if it cannot be read or
/// has no `cpuN` line.
///   std::optional<std::vector<CoreTicks>> now = read_core_ticks();
std::optional<std::vector<CoreTicks>> read_core_ticks(const std::string& stat_path = "/proc/stat");

/// CPU time this process has used so far (user + system, all threads), in seconds.
double process_cpu_seconds();

/// Minor page faults this process has taken so far (all threads): pages the kernel mapped in
/// on first touch, as when freed memory was returned and is used again.
std::uint64_t process_page_faults();

/// Samples the busy fraction of every core every `interval` and the process's CPU time over the
/// run. Cheap to poll: `poll` reads /proc/stat only once an interval has passed.
///
///   CpuRecorder cpu(start);
///   while (running) { cpu.poll(Clock::now()); sleep(...); }
///   report.cpu = cpu.finish();
///
/// If the stat file cannot be read at the start, every call does nothing and finish() returns
/// an empty CpuReport.
class CpuRecorder {
 public:
  static constexpr std::chrono::milliseconds kDefaultInterval{250};

  explicit CpuRecorder(Clock::time_point start,
                       Clock::duration interval = kDefaultInterval,
                       std::string stat_path = "/proc/stat");

  /// Takes a sample if an interval has passed since the last one.
  void poll(Clock::time_point now);
  /// The report from the start to now (core_mean from the first reading and one taken now, so
  /// a run shorter than one interval still has it). Call once.
  CpuReport finish();

 private:
  void sample(Clock::time_point now);

  std::string stat_path_;
  Clock::time_point start_;
  Clock::duration interval_;
  Clock::time_point next_;
  bool enabled_ = false;
  double process_start_s_ = 0;
  std::uint64_t faults_start_ = 0;
  std::vector<CoreTicks> first_;
  std::vector<CoreTicks> last_;
  std::vector<SeriesBuilder> series_;  // [core]
};

/// Appends the CpuReport of a paused pipeline's next run (`segment`, `segment_wall_s` long) to
/// that of its runs before (`whole`, `whole_wall_s` long), so a report that covers every run of
/// the pipeline (autotune's trials, then the rest) has the CPU figures of every run too: CPU
/// time and page faults summed, each core's mean weighted by the runs' wall times, the
/// samples' times continued.
void append_cpu(CpuReport& whole, double whole_wall_s, CpuReport segment, double segment_wall_s);

}  // namespace flowtrain::detail
