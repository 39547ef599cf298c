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
};

/// Where a loader stands: the epoch, and the source position after the last batch it yielded.
struct LoaderState {
  std::uint32_t epoch = 0;
  std::uint64_t position = 0;
};

class HandoffSink;

/// Runs the stages of `options.output`'s phase that it depends on, one epoch per run:
///
///   Loader loader({.config = "graph.yaml", .output = "collate"});
///   loader.start();
///   for (data::Batch batch; loader.next(batch, 0.1) != Loader::Next::kEnd;) { ... }
///
/// An epoch is one pass of its dataset source over this rank's shard (the source's `epochs` is
/// the loop's to decide): epoch e runs the source with e + 1 epochs from position e * P, so its
/// order and augmentation are those of epoch e of a `flowtrain run`. A graph whose source has
/// no epochs (or a mix of sources) is one stream, iterated once.
class Loader {
 public:
  explicit Loader(LoaderOptions options);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  /// Batches of one whole epoch on this rank (Stage::plan); 0 when a stage cannot tell.
  std::uint64_t size();
  /// Batches per epoch are known only for a source that has epochs.
  bool has_epochs() const { return !epochs_param_.empty(); }

  /// Starts (or, after a stop mid-epoch, goes on with) the epoch at the current state; a run
  /// in progress is kept. Throws Error if the graph cannot be built.
  void start();
  enum class Next { kBatch, kEnd, kWaiting };
  /// The next batch, in order, waiting up to `wait_s`; kEnd once the epoch's run ended (the
  /// state moves to the next epoch), kWaiting if none came in time. Rethrows the run's error.
  Next next(data::Batch& batch, double wait_s);
  /// Stops the running epoch and waits for its graph to end; the state stays after the last
  /// batch yielded, so start() goes on from the next one.
  void stop();
  bool running() const { return thread_.joinable(); }

  LoaderState state() const { return state_; }
  /// Throws Error if `state` is not a position of `state.epoch` on this rank.
  void restore(const LoaderState& state);
  /// Epoch `epoch` from its first batch (stops a running one).
  void set_epoch(std::uint32_t epoch);

  /// The report of the last epoch's run (nullopt before one ended).
  const std::optional<RunReport>& last_report() const { return report_; }
  const LoaderOptions& options() const { return options_; }

 private:
  std::unique_ptr<Pipeline> build(const LoaderState& from, HandoffSink** sink);
  std::uint64_t epoch_start(std::uint32_t epoch) const { return epoch * per_epoch_; }

  LoaderOptions options_;
  PipelineConfig phase_;        // the stages `output` depends on
  std::size_t source_ = 0;      // index of the source entry in phase_.stages
  std::string epochs_param_;    // "epochs" if the source has one, else empty
  std::uint64_t per_epoch_ = 0; // source positions of one epoch on this rank
  std::optional<std::uint64_t> size_;
  LoaderState state_;
  std::optional<RunReport> report_;

  std::unique_ptr<Pipeline> pipeline_;
  HandoffSink* sink_ = nullptr;  // owned by pipeline_
  std::thread thread_;
  std::exception_ptr error_;     // of the run in thread_
  bool stopping_ = false;
};

}  // namespace flowtrain::python
