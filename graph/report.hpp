#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "graph/stage.hpp"

namespace flowtrain {

/// One reported drop: which item, and why (a corrupt file, a filter...).
struct DropRecord {
  std::uint64_t seq = 0;
  std::string reason;
};

/// Occupancy of a stage's input queue at one moment of the run.
struct QueueSample {
  double time_s = 0;
  double occupancy = 0;
};

/// One stage in a Progress snapshot.
struct StageProgress {
  std::string name;
  double busy_fraction = 0;          // since the run started, per worker (as in StageReport)
  std::vector<StageResult> live;     // the stage's live_results()
};

/// A snapshot of a running pipeline, for progress lines.
struct Progress {
  double elapsed_s = 0;
  std::uint64_t produced = 0;   // items the source emitted
  std::uint64_t completed = 0;  // items the sink consumed
  std::uint64_t expected = 0;   // items the sink expects in all (Stage::plan), 0 if unknown
  std::vector<StageProgress> stages;  // in pipeline order
};

/// CPU utilisation of each core of the machine (all processes, from /proc/stat), sampled
/// during a run.
struct CpuReport {
  double interval_s = 0;                  // between samples
  std::vector<double> times_s;            // sample times since the run started
  std::vector<std::vector<double>> cores; // [core][sample]: busy fraction 0..1 in the interval
  std::vector<double> core_mean;          // [core]: busy fraction over the whole run
  double process_cpu_s = 0;               // CPU time of this process during the run (user+sys)
  std::uint64_t page_faults = 0;          // minor page faults of this process during the run
};

/// What one stage did during a run.
struct StageReport {
  std::string name;
  StageShape::Kind kind = StageShape::Kind::kMap;
  std::size_t concurrency = kSerial;  // as configured (kUnlimited = 0)
  std::size_t max_concurrency = kUnlimited;  // what the stage allows (kSerial: serial by design)
  std::size_t workers = 1;            // concurrency it could actually reach
  std::size_t queue_capacity = 0;     // of its input queue; 0 for a source
  std::size_t threads_per_invocation = 1;  // intra-op threads of one invocation
  bool intra_op_parallel = false;          // Stage::intra_op_parallel()
  /// The type of the items it takes (a source: that it emits), without its namespace:
  /// "Sample", "Batch", "StepRecord"; what items_in and items_out count.
  std::string item;

  std::uint64_t items_in = 0;     // real items processed (sources: 0)
  std::uint64_t items_out = 0;    // items emitted
  std::uint64_t dropped = 0;      // items dropped with a reason
  std::vector<DropRecord> drops;  // the first kMaxDropRecords of them

  double busy_s = 0;            // summed time inside the stage's code
  double busy_fraction = 0;     // busy_s / (wall time x workers)
  double starved_fraction = 0;  // share of worker time with no input waiting
  double blocked_fraction = 0;  // share of worker time with input but the output queue full
  std::size_t peak_active = 0;  // most invocations seen running at once

  double queue_mean = 0;                  // mean sampled occupancy of the input queue
  double queue_max = 0;                   // highest sampled occupancy
  std::vector<QueueSample> queue_series;  // occupancy over time, at most ~1000 points

  std::vector<StageResult> results;  // what the stage reported (loss, accuracy...)
  StageWait waiting;                 // what it waited for inside busy_s (Stage::waiting)
  std::vector<TimelineSpan> timeline;  // what it timed inside its items (Stage::timeline)

  static constexpr std::size_t kMaxDropRecords = 100;
};

/// One trial of autotune: a layout run for a measured window of real work.
struct AutotuneTrial {
  std::string change;  // from the layout kept before it: "start", "'decode' concurrency 1 -> 2"
  std::string layout;  // the whole layout: "2 graph threads; decode 2; teacher 2 x 1 intra-op"
  double items_per_s = 0;  // the last stage's items per second (steps, in training)
  bool kept = false;       // better than the layout kept before it, by the minimum gain
  /// Run on a throwaway copy of the pipeline whose updates were never committed (to time the
  /// intra-op threads of a training step, which change its sums: autotune_rehearse).
  bool rehearsal = false;
};

/// What autotune tried and chose (RunReport::autotune).
struct AutotuneReport {
  std::vector<AutotuneTrial> trials;
  /// The chosen layout's settings that differ from the config's, as overrides with the
  /// report's key_prefix ("phases.distill.stages.decode.concurrency=2"); empty: nothing better.
  std::vector<std::string> overrides;
  double tuning_s = 0;  // wall time of the trials (real work, included in the run's wall)
  std::uint64_t tuning_items = 0;  // source items produced during the trials
  double rehearsal_s = 0;  // wall time of the rehearsals, before the run (not in its wall)

  /// The trial whose layout was chosen (the last one kept), or null if none was.
  const AutotuneTrial* chosen() const;
};

/// What a whole run did. `format_report` renders it as the table printed after a run.
struct RunReport {
  double wall_s = 0;
  std::size_t threads = 0;  // TBB threads the graph ran on
  std::size_t cores = 0;    // cores the run was granted
  std::size_t peak_threads = 0;  // most threads the graph could keep busy at once (<= cores)
  bool stopped = false;     // stopped early by request_stop() (SIGINT)
  bool paused = false;      // paused by request_pause(): Pipeline::run continues it
  std::vector<StageReport> stages;
  std::string trace_path;  // Chrome trace written, if asked for
  std::string drops_path;  // every dropped item listed there, if asked for and any was dropped
  CpuReport cpu;
  /// Prefix of config keys in the verdict ("phases.distill." for a phase of a multi-phase config).
  std::string key_prefix;
  /// Set when the run tuned its layout first (RunOptions::autotune).
  std::optional<AutotuneReport> autotune;

  /// Index of the stage with the highest busy fraction per worker, if any work was done.
  std::optional<std::size_t> bottleneck() const;
  /// One plain line naming the bottleneck and what to try; then, for each stage that reports
  /// both `gflops` (its model's FLOPs over its time) and `matrix_rate_gflops` (this CPU's
  /// measured rate for such products), the share of that ceiling it reached.
  std::string verdict() const;
  /// One line of how the cores are used: graph threads and each stage's intra-op threads.
  std::string layout() const;

 private:
  std::string bottleneck_verdict() const;
};

std::string format_report(const RunReport& report);

/// The chart of a stage's last timed item (StageReport::timeline): one row per track, time
/// across `columns` characters, each span drawn as its label padded with '=' ("F3==B3=="), '.'
/// where the track was idle; a header names the item, its time and the idle share (the bubble
/// of a pipeline). Empty without spans.
///   'student' timeline of item 10 (0.412 s, 13% idle):
///     partition 0  F0==F1==F2==B0====F3==B1====...
std::string format_timeline(const StageReport& stage, int columns = 96);

/// `n` and its noun, plural unless n is 1: "1 core", "2 graph threads".
std::string count_text(std::size_t n, const char* noun);

/// The trials of autotune as a table, the chosen layout and its settings (format_report
/// includes it):
///   autotune: 5 trial(s) in 21.3 s, on the run's own work (2112 source items)
///     trial    items/s  kept  change
///         1      412.0  yes   start
///         2      598.2  yes   'decode' concurrency 1 -> 2, graph threads 1 -> 2
///   ...
std::string format_autotune(const AutotuneReport& report);

}  // namespace flowtrain
