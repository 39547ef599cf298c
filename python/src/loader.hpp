#pragma once

// The C++ side of `flowtrain.Loader`: one phase of a config, cut after the stage whose batches
// a Python loop wants, run epoch by epoch in a background thread that hands the batches over
// through a bounded queue. No Python in here: module.cpp turns its batches into tensors.

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "distributed/job.hpp"
#include "graph/config.hpp"
#include "graph/report.hpp"
#include "stages/data/batch.hpp"

namespace flowtrain::python {

struct LoaderOptions {
  std::string config;                  // a YAML file
  std::vector<std::string> overrides;  // key.path=value, as on the command line
  std::string output = "collate";      // the stage whose batches the loader yields
  std::string phase;                   // of a multi-phase config; empty: the first having `output`
  std::size_t prefetch = 2;            // batches ready ahead of the loop
  // Each epoch its own batches, as a DataLoader's (false), or one stream over the epochs whose
  // batch across an epoch's end belongs to the next, as `flowtrain run` batches it (true).
  bool rollover = false;
  // Sets `drop_last` of the batching stages it runs (collate, assemble_batch); unset: as the
  // config says.
  std::optional<bool> drop_last;
};

/// Where a loader stands: the epoch, and the source position after the last batch it yielded.
struct LoaderState {
  std::uint32_t epoch = 0;
  std::uint64_t position = 0;
};

class HandoffSink;

/// Runs the stages of `options.output`'s phase that it depends on, a graph for each epoch (one
/// for them all with `rollover`), and hands over their batches in order:
///
///   Loader loader({.config = "graph.yaml", .output = "collate"});
///   data::Batch batch;
///   for (Loader::Next n; (n = loader.next(batch, 0.1)) != Loader::Next::kEnd;) {
///     if (n == Loader::Next::kBatch) use(batch);  // else kWaiting: check for Ctrl-C
///   }
///
/// Epoch e of the loader is epoch e of its dataset source on this rank's shard: a graph runs
/// that epoch alone, and its last batch is partial unless the batching stage drops it
/// (`drop_last`), as a DataLoader's epochs are. With `rollover`, its batches are those of
/// `flowtrain run` over the same config: one graph streams all the epochs, the graph works on
/// ahead, and a batch that begins in one epoch and ends in the next belongs to the next. Epoch e
/// then ends before its first batch that ends past e * P + P (P: the source's positions of one
/// epoch), and its last epoch ends with the stream. A graph whose source has no epochs (or a mix
/// of sources) is one stream, iterated whole each time.
class Loader {
 public:
  explicit Loader(LoaderOptions options);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  /// Batches of one epoch on this rank (Stage::plan): what each epoch yields, or with rollover
  /// about as many; 0 when a stage cannot tell.
  std::uint64_t size();
  /// The graph has one dataset source, with epochs; else the loader is one stream.
  bool has_epochs() const { return epochs_; }
  /// A graph runs each epoch alone (has epochs, without rollover).
  bool whole_epochs() const { return epochs_ && !options_.rollover; }

  enum class Next { kBatch, kEnd, kWaiting };
  /// The next batch of the epoch, waiting up to `wait_s`; kWaiting if none came in time, kEnd
  /// once the epoch is over (the state moves on to the next one). Starts the graph where the
  /// state stands if it is not running (throws Error if it cannot be built); rethrows the
  /// run's error.
  Next next(data::Batch& batch, double wait_s);
  /// Stops the graph and waits for it to end; the state stays after the last batch yielded.
  void stop();
  /// Asks the graph to stop and returns at once (Ctrl-C: a stage may be inside a long call);
  /// the next call of next() or stop() waits for it to end. The state is as after stop().
  void cancel();
  bool running() const { return thread_.joinable(); }

  LoaderState state() const { return state_; }
  /// Throws Error if `state` is not a position of `state.epoch` on this rank.
  void restore(const LoaderState& state);
  /// The next batches are epoch `epoch`'s from its first sample: the graph restarts there. For
  /// the epoch the loader is in, nothing changes (calling it every epoch costs nothing, and a
  /// restored loader keeps its place).
  void set_epoch(std::uint32_t epoch);

  /// The report of the graph's last run, once it ended (stop(), or the end of a stream).
  const std::optional<RunReport>& last_report() const { return report_; }

 private:
  // What the stages it builds are handed: placement_.
  BuildContext context();
  std::unique_ptr<Pipeline> build(std::uint32_t epochs, std::uint64_t from, HandoffSink** sink);
  void start();
  // Joins the run's thread; keeps its report, or returns its error.
  std::exception_ptr join();
  // Throws Error if the source has no epoch `epoch`.
  void check_epoch(std::uint32_t epoch) const;
  std::uint64_t epoch_start(std::uint32_t epoch) const { return epoch * per_epoch_; }
  std::uint32_t epoch_of(const data::Batch& batch) const {
    return static_cast<std::uint32_t>((batch.end_position - 1) / per_epoch_);
  }

  LoaderOptions options_;
  PipelineConfig phase_;            // the stages `output` depends on
  JobPlacement placement_;          // where this process stands in its job, for the stages
  std::size_t source_ = 0;          // index of the source entry in phase_.stages
  bool epochs_ = false;             // see has_epochs
  std::uint32_t epochs_total_ = 1;  // the source's epochs
  std::uint64_t per_epoch_ = 0;     // source positions of one epoch on this rank
  std::optional<std::uint64_t> size_;
  LoaderState state_;
  std::optional<RunReport> report_;

  std::unique_ptr<Pipeline> pipeline_;
  HandoffSink* sink_ = nullptr;  // owned by pipeline_
  std::thread thread_;
  std::exception_ptr error_;  // of the run in thread_
  bool cancelled_ = false;    // cancel() was called on the run in thread_
};

}  // namespace flowtrain::python
