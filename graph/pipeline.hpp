#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "graph/lambda_stage.hpp"
#include "graph/layout.hpp"
#include "graph/options.hpp"
#include "graph/report.hpp"
#include "graph/stage.hpp"

namespace flowtrain {

class Pipeline;

/// One end of an edge: the output of a stage (or one named output of a router), typed by its
/// items (Anything where the stage does not say, as for one the registry built).
template <class Out>
struct Output {
  std::string name;  // "stage" or "router.output"
};

namespace detail {
// The item types a stage class declares (Anything where it does not, as Stage itself).
template <class S>
auto input_of() {
  if constexpr (requires { typename S::input_type; }) {
    return std::type_identity<typename S::input_type>{};
  } else {
    return std::type_identity<Anything>{};
  }
}
template <class S>
auto output_of() {
  if constexpr (requires { typename S::output_type; }) {
    return std::type_identity<typename S::output_type>{};
  } else {
    return std::type_identity<Anything>{};
  }
}

template <class P>
struct IsStagePtr : std::false_type {};
template <class S>
struct IsStagePtr<std::unique_ptr<S>> : std::is_base_of<Stage, S> {};
}  // namespace detail

/// A stage added to a Pipeline, typed by the items it takes and gives, for `connect`:
///
///   auto numbers = p.add<stages::SequenceSource>("numbers", {.count = 1000});
///   auto square = p.add("square", [](std::uint64_t n) { return n * n; }, {.concurrency = 2});
///   p.connect(numbers, square);  // does not compile if the item types differ
///
/// `add` on a handle adds to its pipeline, so a chain of stages reads top to bottom.
template <class In, class Out>
class StageHandle {
 public:
  StageHandle(Pipeline& pipeline, std::string name)
      : pipeline_(&pipeline), name_(std::move(name)) {}
  const std::string& name() const { return name_; }
  operator Output<Out>() const { return {name_}; }
  /// A router's output `port`: `p.connect(split.output("picked"), spin)`.
  Output<Out> output(const std::string& port) const { return {name_ + "." + port}; }

  template <class P>
    requires detail::IsStagePtr<P>::value
  auto add(std::string name, P stage, StageOptions options = {}) const;
  template <class S>
  auto add(std::string name, const typename S::Options& options = {}, StageOptions run = {}) const;
  template <detail::LambdaStage F>
  auto add(std::string name, F fn, StageOptions options = {}) const;

 private:
  Pipeline* pipeline_;
  std::string name_;
};


namespace detail {
template <class S>
using HandleOf = StageHandle<typename decltype(input_of<S>())::type,
                             typename decltype(output_of<S>())::type>;
}  // namespace detail

/// A graph of stages run as a oneTBB flow graph with bounded queues. Each stage takes the
/// output of the stage added before it unless it names its inputs; one output may feed several
/// stages, and a join pairs items across its inputs:
///
///   source -> [queue] -> stage -> [queue] -> ... -> sink
///
///              +-> teacher_a -+
///   batches ---+              +-> join -> train
///              +-> teacher_b -+
///
///   Pipeline p;
///   auto numbers = p.add<stages::SequenceSource>("numbers", {.count = 1000});
///   auto a = p.add("teacher_a", std::make_unique<Infer>(...), {.concurrency = 2});
///   auto b = p.add("teacher_b", std::make_unique<Infer>(...));
///   auto mean = p.add("mean", std::make_unique<Mean>());
///   auto train = p.add("train", [&](float v) { total += v; }, {.ordered = true});
///   p.connect(numbers, a).connect(numbers, b).connect(a, mean).connect(b, mean);
///   RunReport report = p.run({.threads = 2});
///   std::cout << format_report(report);
///
/// A stage is a class deriving from a typed base (graph/stage.hpp), a built-in one with its
/// typed options (`add<S>(name, S::Options)`), or a lambda. Stages are added in data-flow order
/// (an input is added before the stages taking it). An exception in any stage cancels the graph
/// and is rethrown from run() as a StageError naming the stage and the item.
class Pipeline {
 public:
  Pipeline();
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  /// Adds a stage taking its inputs from `options.inputs` or from `connect` (neither: the
  /// stage added before). Throws Error if its options cannot be (concurrency above the stage's
  /// maximum); the edges are checked when the graph is complete (`check`, `run`), with
  /// add_problem's message (item types, kinds, unknown inputs, capacities).
  template <class P>
    requires detail::IsStagePtr<P>::value
  auto add(std::string name, P stage, StageOptions options = {}) {
    using S = typename P::element_type;
    add_node(name, std::move(stage), std::move(options));
    return detail::HandleOf<S>(*this, std::move(name));
  }

  /// Adds the built-in stage `S` with its typed options, checked as a config's would be:
  ///   p.add<stages::SpinStage>("spin", {.rounds = 500}, {.concurrency = 2});
  template <class S>
  auto add(std::string name, const typename S::Options& options = {}, StageOptions run = {}) {
    check_options(name, option_specs<typename S::Options>(), to_params(options));
    return add(std::move(name), std::make_unique<S>(options), std::move(run));
  }

  /// Adds a lambda as a stage: `() -> std::optional<T>` a source (std::nullopt ends it),
  /// `(In) -> Out` a map (returning std::optional<Out>: std::nullopt drops the item),
  /// `(In) -> void` a sink. With concurrency > 1 it must be thread-safe.
  template <detail::LambdaStage F>
  auto add(std::string name, F fn, StageOptions options = {}) {
    return add(std::move(name), std::make_unique<detail::LambdaStageOf<F>>(std::move(fn)),
               std::move(options));
  }

  /// Draws an edge: `to` takes the items of `from` (after the inputs it already has). Both are
  /// added already; `from` before `to`. Item types must match, or one side be Anything.
  template <class Out, class In, class Next>
  Pipeline& connect(const Output<Out>& from, const StageHandle<In, Next>& to) {
    static_assert(std::is_same_v<Out, In> || std::is_same_v<Out, Anything> ||
                      std::is_same_v<In, Anything>,
                  "connect: the stage taking the items expects another item type");
    add_input(to.name(), from.name);
    return *this;
  }
  template <class PrevIn, class Out, class In, class Next>
  Pipeline& connect(const StageHandle<PrevIn, Out>& from, const StageHandle<In, Next>& to) {
    return connect(Output<Out>(from), to);
  }

  /// Throws Error naming the first stage whose edges cannot work (add_problem, or the stage's
  /// own Stage::input_problem) or the graph's problem (graph_problem). run() checks so first.
  void check() const;

  /// The stages as added, for graph_text and checks.
  std::vector<StageDecl> decls() const;

  /// Runs the graph to completion (sources exhausted or stopped, every item drained).
  /// Before it starts: seeks the source where a stage restored from a checkpoint asks
  /// (Stage::resume_position), tells each stage how many items to expect (Stage::plan), and
  /// checks the thread budget. A pipeline runs once, unless its run was paused.
  RunReport run(const RunOptions& options = {});

  /// The items the last stage (a sink) will probably take, as Stage::plan passes the sources'
  /// counts along the graph (from where a resume seeks them, once run() has started), without
  /// running anything; std::nullopt where a stage cannot tell. What run()'s progress line
  /// expects, and what a loader reports as its length.
  std::optional<std::uint64_t> planned_items();

  /// Asks the sources to stop; items already produced are finished. Async-signal-safe, may be
  /// called from any thread or a signal handler, before or during run().
  void request_stop() noexcept { halt_.fetch_or(kStopped, std::memory_order_relaxed); }

  /// Pauses a running graph: the sources stop, every item produced is finished, and run()
  /// returns a report with `paused` set, without `finish` being called on any stage (a batcher
  /// keeps its partial batch). The layout may then change (set_concurrency, ...) and run()
  /// continues the same stream: the items, their numbers and every stage's state carry on as
  /// if the run had not paused, so the results are those of one run. The report of each run
  /// counts every item since the first (its wall time too); its sampled figures (starved,
  /// blocked, queues, CPU) are that run's. Autotune trials are such runs.
  ///   std::thread timer([&] { sleep(3); p.request_pause(); });
  ///   RunReport first = p.run(options);           // first.paused
  ///   timer.join();
  ///   p.set_concurrency("decode", 2);
  ///   RunReport rest = p.run(options);            // to the end
  void request_pause() noexcept { halt_.fetch_or(kPaused, std::memory_order_relaxed); }

  /// Pauses as request_pause does, but throws the work in flight away instead of finishing
  /// it: an item a stage has not started yet becomes a gap in the stream (no stage after sees
  /// it, and it is not counted as a drop), except where a stage waits for tokens
  /// (StageOptions::token_from) or follows one, so that every token taken comes back. The
  /// next run goes on after the last item the source produced, so the lost items never come.
  /// For a run whose work is thrown away anyway: autotune's rehearsals, where finishing a
  /// training step's queued batches would take seconds.
  void request_pause_discarding() noexcept {
    halt_.fetch_or(kPaused | kDiscard, std::memory_order_relaxed);
  }

  /// Between runs (before the first, or after a paused one): stage `stage`'s concurrency or
  /// input queue capacity from now on. Throws Error naming the stage if it does not exist or
  /// cannot take the value; the edges are checked again when run() starts.
  void set_concurrency(const std::string& stage, std::size_t concurrency);
  void set_queue_capacity(const std::string& stage, std::size_t capacity);
  /// The same for the intra-op threads of one invocation (Stage::set_threads_per_invocation):
  /// false if the stage cannot change them (its count is fixed, or changes its results).
  bool set_threads_per_invocation(const std::string& stage, std::size_t threads);

  /// Items the source (or the mix) has produced since the first run started; safe to call
  /// from any thread while a run lasts (a tuner's rate window).
  std::uint64_t produced() const;
  /// Items the last stage (a sink) has taken since the first run started; the same.
  std::uint64_t completed() const;

  std::size_t size() const { return nodes_.size(); }

 private:
  struct Node {
    std::string name;
    std::unique_ptr<Stage> stage;
    StageShape shape;
    StageOptions options;
    std::vector<InputLink> inputs;  // the stages (and router outputs) it takes items from
  };
  class Runtime;
  struct RunState;
  Node& node_to_change(const std::string& stage);
  void change_options(const std::string& stage, const std::function<void(StageOptions&)>& change);
  void add_node(const std::string& name, std::unique_ptr<Stage> stage, StageOptions options);
  void add_input(const std::string& stage, const std::string& input);
  static void check_options(const std::string& name,
                            const std::vector<ParamSpec>& specs,
                            const Params& params);
  // Every stage's inputs (add_problem), in the order added; throws on the first problem.
  std::vector<std::vector<InputLink>> resolve_inputs() const;
  // Seeks the source to the position a resuming stage asks for, then plans the item counts.
  void prepare();

  std::vector<Node> nodes_;
  // Why the sources stop: request_stop and request_pause set their bit (and
  // request_pause_discarding kDiscard too); one load per item.
  static constexpr unsigned kStopped = 1, kPaused = 2, kDiscard = 4;
  std::atomic<unsigned> halt_{0};
  bool ran_ = false;
  bool paused_ = false;              // the last run was paused: run() continues it
  std::unique_ptr<RunState> state_;  // made by the first run
  std::atomic<const RunState*> published_{nullptr};  // state_, for produced() and completed()
  std::uint64_t expected_ = 0;  // items the last sink expects, from prepare() (0: unknown)
};

template <class In, class Out>
template <class P>
  requires detail::IsStagePtr<P>::value
auto StageHandle<In, Out>::add(std::string name, P stage, StageOptions options) const {
  return pipeline_->add(std::move(name), std::move(stage), std::move(options));
}

template <class In, class Out>
template <detail::LambdaStage F>
auto StageHandle<In, Out>::add(std::string name, F fn, StageOptions options) const {
  return pipeline_->add(std::move(name), std::move(fn), std::move(options));
}

template <class In, class Out>
template <class S>
auto StageHandle<In, Out>::add(std::string name,
                               const typename S::Options& options,
                               StageOptions run) const {
  return pipeline_->template add<S>(std::move(name), options, std::move(run));
}

class StopVote;

/// Stops `pipeline` on SIGINT and SIGTERM while in scope; a second signal ends the process the
/// default way. Restores the previous handlers on destruction. One at a time per process.
/// With a `vote` (a rank of a job: World::stop_vote) that a stage holds, a signal is this
/// rank's vote, and the pipeline stops when the ranks agree (graph/stop_vote.hpp).
class StopOnSignal {
 public:
  explicit StopOnSignal(Pipeline& pipeline, StopVote* vote = nullptr);
  ~StopOnSignal();
  /// The signal that stopped the pipeline (SIGINT or SIGTERM; another rank's, where the ranks
  /// agreed to stop for it), or 0.
  int received() const;
  StopOnSignal(const StopOnSignal&) = delete;
  StopOnSignal& operator=(const StopOnSignal&) = delete;

 private:
  StopVote* vote_;
};

}  // namespace flowtrain
