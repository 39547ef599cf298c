#include "python/src/loader.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <utility>

#include "distributed/job.hpp"
#include "graph/config.hpp"
#include "graph/error.hpp"
#include "graph/freed_memory.hpp"
#include "graph/registry.hpp"
#include "graph/stage.hpp"
#include "runner/run_phases.hpp"

namespace flowtrain::python {

namespace {

// What the graph hands the Python loop: batches in order, at most `capacity` waiting.
struct Handoff {
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<data::Batch> ready;
  std::size_t capacity = 2;
  bool closed = false;  // the loop stopped: batches still coming are let go
  bool ended = false;   // the run returned (or threw)
};

std::string entry_names(const std::vector<StageConfig>& stages) {
  std::string names;
  for (const StageConfig& s : stages) names += (names.empty() ? "" : ", ") + s.name;
  return names;
}

}  // namespace

/// The loader's end of the graph: takes the output stage's batches in order and queues them for
/// the loop, waiting while `prefetch` are queued (the report shows that wait as this node's busy
/// time: the loop is then the bottleneck). Asks the source to start where the loader stands.
class HandoffSink final : public SerialSink<data::Batch> {
 public:
  HandoffSink(std::shared_ptr<Handoff> handoff, std::uint64_t position)
      : handoff_(std::move(handoff)), position_(position) {}
  std::optional<ResumePosition> resume_position() const override {
    return position_ > 0 ? std::optional(ResumePosition{.items = position_}) : std::nullopt;
  }
  Handoff& handoff() { return *handoff_; }
  // Its time waiting for room in the hand-off: the loop, not the graph, set the pace then.
  StageWait waiting() const override {
    const double seconds = static_cast<double>(waited_ns_.load(std::memory_order_relaxed)) / 1e9;
    return {.seconds = seconds, .what = "the Python loop to take its batches", .held_after = false};
  }

 protected:
  void consume(data::Batch&& batch, ItemContext&) override {
    std::unique_lock lock(handoff_->mutex);
    const auto full = [&] {
      return !handoff_->closed && handoff_->ready.size() >= handoff_->capacity;
    };
    if (full()) {
      const auto begin = std::chrono::steady_clock::now();
      handoff_->changed.wait(lock, [&] { return !full(); });
      waited_ns_.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(
                               std::chrono::steady_clock::now() - begin)
                               .count(),
                           std::memory_order_relaxed);
    }
    if (handoff_->closed) return;
    handoff_->ready.push_back(std::move(batch));
    handoff_->changed.notify_all();
  }

 private:
  std::shared_ptr<Handoff> handoff_;
  std::uint64_t position_;
  std::atomic<std::int64_t> waited_ns_{0};
};

Loader::Loader(LoaderOptions options) : options_(std::move(options)) {
  if (options_.prefetch < 1) throw Error("Loader: prefetch must be at least 1");
  keep_freed_memory();  // as flowtrain run does: buffers reused, not faulted in again each time
  const RunConfig config = load_run_config(options_.config, options_.overrides);
  const PipelineConfig* phase = nullptr;
  std::optional<std::size_t> output;
  for (const PipelineConfig& p : config.phases) {
    if (!options_.phase.empty() && p.name != options_.phase) continue;
    output = entry_index(p.stages, options_.output);
    phase = &p;
    if (output || !options_.phase.empty()) break;
  }
  const std::string where =
      options_.config +
      (phase && !phase->name.empty() ? " (phase " + phase->name + ")" : std::string());
  if (!phase) {
    std::string names;
    for (const PipelineConfig& p : config.phases) names += (names.empty() ? "" : ", ") + p.name;
    throw Error("Loader: " + options_.config + " has no phase '" + options_.phase +
                "' (phases: " + names + ")");
  }
  if (!output || phase->stages[*output].name != options_.output) {
    throw Error("Loader: " + where + " has no stage '" + options_.output +
                "' to take batches from (stages: " + entry_names(phase->stages) + ")");
  }
  const StageInfo& info = *Registry::global().find(phase->stages[*output].type);
  if (info.shape.output.id != typeid(data::Batch)) {
    throw Error("Loader: stage '" + options_.output + "' (" + info.type + ") of " + where +
                " emits " + info.shape.output.name() +
                "; a Loader yields batches: name a stage that emits them (collate, "
                "assemble_batch, stage_to_device, teacher_infer)");
  }
  phase_ = cut_phase(*phase, options_.output);
  if (options_.drop_last) {
    bool batching = false;
    for (StageConfig& s : phase_.stages) {
      if (Registry::global().find(s.type)->find_param("drop_last") == nullptr) continue;
      s.params.set("drop_last", *options_.drop_last);
      batching = true;
    }
    if (!batching) {
      throw Error("Loader: drop_last: no stage that '" + options_.output + "' of " + where +
                  " depends on batches with a drop_last param (collate, assemble_batch)");
    }
  }
  // Under torchrun or Slurm, the ranks on this machine share its cores, as in flowtrain run.
  placement_ = job_placement_from_env();
  runner::plan_for_job(phase_, placement_);
  std::size_t sources = 0;
  for (std::size_t i = 0; i < phase_.stages.size(); ++i) {
    const StageInfo& s = *Registry::global().find(phase_.stages[i].type);
    if (s.shape.kind != StageShape::Kind::kSource) continue;
    ++sources;
    source_ = i;
    epochs_ = s.find_param("epochs") != nullptr;
  }
  if (epochs_) {
    epochs_total_ = static_cast<std::uint32_t>(phase_.stages[source_].params.get_int("epochs"));
  }
  if (sources != 1) epochs_ = false;  // a mix: one stream
  if (has_epochs()) {
    // Positions of one epoch: the source alone, with one epoch, says how many it will give.
    StageConfig source = phase_.stages[source_];
    source.params.set("epochs", std::int64_t{1});
    try {
      per_epoch_ = Registry::global()
                       .find(source.type)
                       ->make(source.params, context())
                       ->plan(std::nullopt)
                       .value_or(0);
    } catch (const std::exception& e) {
      throw Error(source.location + ": stage '" + source.name + "': " + e.what());
    }
    if (per_epoch_ == 0) epochs_ = false;  // nothing on this rank: an empty stream
  }
}

Loader::~Loader() { stop(); }

BuildContext Loader::context() {
  BuildContext context;
  context.provide(placement_);  // a source's shard follows this process's rank
  return context;
}

std::unique_ptr<Pipeline> Loader::build(std::uint32_t epochs,
                                        std::uint64_t from,
                                        HandoffSink** sink) {
  PipelineConfig phase = phase_;
  if (has_epochs()) phase.stages[source_].params.set("epochs", std::int64_t{epochs});
  std::unique_ptr<Pipeline> pipeline = build_pipeline(phase, Registry::global(), context());
  // The node whose batches leave: the output entry, or the last node it brings along.
  std::string tap;
  std::size_t tap_concurrency = kSerial;
  for (const StageDecl& d : pipeline->decls()) {
    if ((d.name == options_.output || d.name.rfind(options_.output + "/", 0) == 0) &&
        d.shape.output.id == typeid(data::Batch)) {
      tap = d.name;
      tap_concurrency = d.options.concurrency;
    }
  }
  auto handoff = std::make_shared<Handoff>();
  handoff->capacity = options_.prefetch;
  auto owned = std::make_unique<HandoffSink>(handoff, from);
  *sink = owned.get();
  // Its input queue: a slot for each worker of the output stage (an unlimited one: 8).
  const std::size_t queue = tap_concurrency == kUnlimited ? 8 : tap_concurrency;
  pipeline->add(
      "python", std::move(owned),
      {.concurrency = kSerial, .queue_capacity = queue, .ordered = true, .inputs = {tap}});
  return pipeline;
}

std::uint64_t Loader::size() {
  if (!size_) {
    HandoffSink* sink = nullptr;
    size_ = build(1, 0, &sink)->planned_items().value_or(0);
  }
  return *size_;
}

void Loader::start() {
  // Without rollover, a graph runs the epoch the loader is in, to its end.
  pipeline_ = build(whole_epochs() ? state_.epoch + 1 : epochs_total_, state_.position, &sink_);
  pipeline_->check();
  thread_ = std::thread([this, run = phase_.run] {
    Handoff& handoff = sink_->handoff();
    try {
      report_ = pipeline_->run(run);
    } catch (...) {
      error_ = std::current_exception();
    }
    std::lock_guard lock(handoff.mutex);
    handoff.ended = true;
    handoff.changed.notify_all();
  });
}

std::exception_ptr Loader::join() {
  thread_.join();
  cancelled_ = false;
  pipeline_.reset();
  sink_ = nullptr;
  return std::exchange(error_, nullptr);
}

Loader::Next Loader::next(data::Batch& batch, double wait_s) {
  if (has_epochs()) check_epoch(state_.epoch);
  if (has_epochs() && options_.rollover && state_.position == epoch_start(state_.epoch + 1)) {
    state_.epoch += 1;  // the last batch ended with the epoch's last sample
    return Next::kEnd;
  }
  if (cancelled_) stop();  // what the cancelled run says no longer matters
  if (!running()) start();
  Handoff& handoff = sink_->handoff();
  {
    std::unique_lock lock(handoff.mutex);
    handoff.changed.wait_for(lock, std::chrono::duration<double>(wait_s),
                             [&] { return !handoff.ready.empty() || handoff.ended; });
    if (!handoff.ready.empty()) {
      if (has_epochs() && options_.rollover && epoch_of(handoff.ready.front()) > state_.epoch) {
        // The epoch is over; this batch waits for the next one's loop.
        state_.epoch += 1;
        return Next::kEnd;
      }
      batch = std::move(handoff.ready.front());
      handoff.ready.pop_front();
      handoff.changed.notify_all();
      state_.position = batch.end_position;
      return Next::kBatch;
    }
    if (!handoff.ended) return Next::kWaiting;
  }
  if (const std::exception_ptr error = join()) std::rethrow_exception(error);
  if (whole_epochs()) {
    state_ = {state_.epoch + 1, epoch_start(state_.epoch + 1)};  // the epoch's graph ended
  } else if (has_epochs()) {
    state_.epoch += 1;  // the stream ended with its last epoch
  } else {
    state_ = {};  // a stream: the next loop runs it again
  }
  return Next::kEnd;
}

void Loader::stop() {
  if (!running()) return;
  cancel();
  join();  // the loop left: what the stopped run says no longer matters
}

void Loader::cancel() {
  if (!running() || cancelled_) return;
  cancelled_ = true;
  {
    Handoff& handoff = sink_->handoff();
    std::lock_guard lock(handoff.mutex);
    handoff.closed = true;
    handoff.ready.clear();  // their buffers go back to the pool
    handoff.changed.notify_all();
  }
  // The work in flight is for batches nobody will take: thrown away, not finished.
  pipeline_->request_pause_discarding();
}

void Loader::restore(const LoaderState& state) {
  // The loader stands in `epoch` between its first sample and its end; its last batch may
  // have begun in the epoch before.
  // (A stream, a mix of sources say, has no epochs: its position is the stream's.)
  const auto in_epoch = [&] {
    const std::uint64_t at = state.position == 0 ? 0 : (state.position - 1) / per_epoch_;
    return state.epoch <= epochs_total_ && (at == state.epoch || at + 1 == state.epoch);
  };
  if (has_epochs() ? !in_epoch() : state.epoch != 0) {
    throw Error("Loader.load_state_dict: position " + std::to_string(state.position) +
                " is not in epoch " + std::to_string(state.epoch) + " of this rank (" +
                std::to_string(per_epoch_) +
                " positions an epoch): the state is from another dataset, rank count or config");
  }
  stop();
  state_ = state;
}

void Loader::check_epoch(std::uint32_t epoch) const {
  if (epoch < epochs_total_) return;
  const StageConfig& source = phase_.stages[source_];
  throw Error("Loader: epoch " + std::to_string(epoch) + " is past the " +
              std::to_string(epochs_total_) + " epoch(s) of source '" + source.name + "' (" +
              source.location + "): raise its epochs (stages." + source.name +
              ".params.epochs=N) for a longer loop");
}

void Loader::set_epoch(std::uint32_t epoch) {
  if (!has_epochs() && epoch != 0) {
    throw Error("Loader.set_epoch(" + std::to_string(epoch) + "): the source of '" +
                options_.output +
                "' has no epochs (a mix of sources, or a source without an "
                "`epochs` param): the loader is one stream");
  }
  if (epoch == state_.epoch) return;  // the loader is in that epoch already
  if (has_epochs()) check_epoch(epoch);
  stop();
  state_ = {epoch, epoch_start(epoch)};
}

}  // namespace flowtrain::python
