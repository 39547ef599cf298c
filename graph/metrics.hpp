#pragma once

// Run-time counters of the stages and the background sampler that turns them into the
// starved / blocked fractions and queue occupancy of a RunReport. Internal to graph/.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "graph/report.hpp"

namespace flowtrain::detail {

using Clock = std::chrono::steady_clock;

/// Every drop of a run as CSV lines (stage,item,reason) in a file: created when the run starts
/// (so a path that cannot be written fails before any work), removed at the end if nothing
/// was dropped.
class DropLog {
 public:
  /// Throws Error naming the path if the file cannot be created.
  explicit DropLog(std::string path);
  ~DropLog();
  DropLog(const DropLog&) = delete;
  DropLog& operator=(const DropLog&) = delete;

  void write(const std::string& stage, std::uint64_t seq, const std::string& reason);
  /// Closes the file (removed if empty); returns its path if it lists any drop, else "".
  /// Throws Error naming the path if a write failed.
  std::string close();

 private:
  std::mutex mutex_;
  std::string path_;
  std::FILE* file_ = nullptr;
  std::uint64_t lines_ = 0;
  bool failed_ = false;
};

/// Counters one stage updates on its hot path: a few relaxed atomic adds per item.
struct alignas(64) StageCounters {
  std::atomic<std::uint64_t> started{0};  // items taken from the input queue (with tombstones)
  std::atomic<std::uint64_t> emitted{0};  // items put on the output edge (with tombstones)
  std::atomic<std::uint32_t> active{0};
  std::atomic<std::uint32_t> peak_active{0};
  std::atomic<std::uint64_t> items_in{0};
  std::atomic<std::uint64_t> items_out{0};
  std::atomic<std::uint64_t> busy_ns{0};

  std::mutex drops_mutex;  // drops are rare: a lock is fine
  std::uint64_t dropped = 0;
  std::vector<DropRecord> drops;
  DropLog* drop_log = nullptr;  // every drop, when the run lists them in a file
  std::string name;             // the stage's, for the drop log

  void enter() {
    const std::uint32_t now = active.fetch_add(1, std::memory_order_relaxed) + 1;
    std::uint32_t peak = peak_active.load(std::memory_order_relaxed);
    while (now > peak && !peak_active.compare_exchange_weak(peak, now)) {
    }
  }
  void leave(Clock::duration busy) {
    busy_ns.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(busy).count(),
                      std::memory_order_relaxed);
    active.fetch_sub(1, std::memory_order_relaxed);
  }
  void record_drop(std::uint64_t seq, std::string reason);
};

/// Keeps a time series at most ~2 x kMaxPoints long by averaging neighbours as it grows.
class SeriesBuilder {
 public:
  static constexpr std::size_t kMaxPoints = 512;
  void add(double time_s, double value);
  std::vector<QueueSample> take();

 private:
  std::vector<QueueSample> points_;
  std::size_t stride_ = 1;
  QueueSample pending_;
  std::size_t pending_count_ = 0;
};

/// Where a stage sits, as the sampler needs it.
struct StageGeometry {
  std::size_t workers = 1;       // concurrency the stage can reach
  std::size_t out_capacity = 0;  // its output slots (0: it is a sink)
  std::vector<std::size_t> inputs;     // the stages it takes items from (none: the source)
  std::vector<std::size_t> consumers;  // the stages taking its output
  std::string name;              // for progress snapshots
  const Stage* stage = nullptr;  // asked for live_results() in progress snapshots
};

class CpuRecorder;

/// Samples every stage at a fixed interval on its own thread (not a TBB worker): input queue
/// occupancy, and for each idle worker slot whether it is starved (no input) or blocked
/// (input waiting but the output queue full). On the same thread: the machine's per-core CPU
/// use (every CpuRecorder interval) and the progress snapshots.
class Sampler {
 public:
  using ProgressFn = std::function<void(const Progress&)>;
  /// `expected`: items the sink expects in all (from the plan), 0 if unknown.
  Sampler(const std::vector<std::unique_ptr<StageCounters>>& counters,
          std::vector<StageGeometry> geometry,
          double interval_ms,
          Clock::time_point start,
          ProgressFn on_progress = {},
          double progress_interval_s = 1,
          std::uint64_t expected = 0);
  ~Sampler();
  void stop();
  /// Fills starved/blocked fractions and queue statistics of `report.stages` (as many as it
  /// has) and `report.cpu`. Call once, after stop().
  void fill(RunReport& report);

 private:
  void loop();
  void sample_once();
  void report_progress();
  // Items emitted by `producer` that `consumer` has not started yet.
  double queued_between(std::size_t producer, std::size_t consumer) const;
  // Items waiting in front of `stage` (for a join: complete sets).
  double waiting_for(std::size_t stage) const;

  const std::vector<std::unique_ptr<StageCounters>>& counters_;
  std::vector<StageGeometry> geometry_;
  std::chrono::microseconds interval_;
  Clock::time_point start_;
  ProgressFn on_progress_;
  Clock::duration progress_interval_;
  Clock::time_point next_progress_;
  std::uint64_t expected_;
  std::unique_ptr<CpuRecorder> cpu_;

  struct Accumulated {
    double starved_slots = 0;
    double blocked_slots = 0;
    double queue_sum = 0;
    double queue_max = 0;
    SeriesBuilder series;
  };
  std::vector<Accumulated> acc_;
  std::uint64_t samples_ = 0;

  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace flowtrain::detail
