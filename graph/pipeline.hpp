#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "graph/report.hpp"
#include "graph/stage.hpp"

namespace flowtrain {

/// How one stage runs inside a pipeline.
struct StageOptions {
  /// Invocations that may run at once: kSerial (1), N, or kUnlimited (0).
  std::size_t concurrency = kSerial;
  /// Output slots of each input towards this one: items being produced for this stage plus
  /// items waiting for it never exceed this. Must be >= each input's concurrency. A stage whose
  /// output several stages consume gets the smallest of their capacities.
  std::size_t queue_capacity = 8;
  /// Deliver items to this stage in sequence order (forced on for stages that require it).
  bool ordered = false;
  /// Names of the stages this one takes its items from, added before it; empty: the stage
  /// added just before. One for a map, flat map, router or sink; two or more for a join or
  /// merge. A stage's output reaches every stage that names it (fan-out); a router's outputs
  /// are named "router.output".
  std::vector<std::string> inputs;
  /// A declared token edge, the one cycle a graph may have: this stage starts an item only
  /// with a token, and the named flat map downstream of it hands one back each time it calls
  /// `out.send_token()`. The stage holds one token at the start. Items dropped upstream pass
  /// without one. `train_step` waits so for its `optimizer_step`: forward t+1 starts on the
  /// weights of update t, while the data stages work ahead.
  std::string token_from;
};

/// How a pipeline runs.
struct RunOptions {
  std::size_t threads = 0;        // TBB threads for the graph (0: one per hardware thread)
  /// Cores the run may use (0: one per hardware thread). The busiest moment the graph can reach
  /// (`threads` invocations at once, each using its stage's threads_per_invocation()) must fit.
  std::size_t cores = 0;
  double sample_interval_ms = 2;  // how often queue occupancy and stage states are sampled
  std::string trace_path;         // write a Chrome trace-event JSON here when not empty
  /// Called every `progress_interval_s` from a background thread while the run lasts.
  std::function<void(const Progress&)> on_progress;
  double progress_interval_s = 1;
  /// Where this pipeline's keys sit in its config, copied to RunReport::key_prefix for the
  /// verdict's advice: "phases.distill." for a phase of a multi-phase config (its
  /// PipelineConfig::run has it), empty for a single pipeline.
  std::string key_prefix;
};

/// An input that takes every item of its stage (not one output of a router).
inline constexpr std::size_t kAllOutputs = static_cast<std::size_t>(-1);

/// One input of a stage: the stage it comes from and, for a router, which of its outputs.
struct InputLink {
  std::size_t stage = 0;
  std::size_t output = kAllOutputs;
};

/// What the graph checks know of a stage before it is built (a registry entry has the same).
struct StageDecl {
  std::string name;
  StageShape shape;
  StageOptions options;
  /// Threads one invocation keeps busy (Stage::threads_per_invocation), and the param that sets
  /// them ("intraop_threads"; empty when fixed), for the thread budget and its advice.
  std::size_t threads_per_invocation = 1;
  std::string threads_param;
};

/// Returns a one-line problem with `options` for a stage of this shape, else an empty string.
std::string options_problem(const StageShape& shape, const StageOptions& options);

/// Returns a one-line problem if `next` cannot be added after the stages `earlier` (listed in
/// the order they were added), else an empty string; on success `inputs` holds its inputs
/// (indices in `earlier`, and the router output each takes). Checks the options, the inputs (names, count, kinds, item types,
/// capacities), that a join's inputs are numbered alike and that consumers of a shared output
/// can copy it. Shared by Pipeline::add and config validation so both give the same message.
std::string add_problem(const std::vector<StageDecl>& earlier,
                        const StageDecl& next,
                        std::vector<InputLink>& inputs);

/// Returns a one-line problem if the complete graph `stages` cannot run (the last stage is not a
/// sink; an output nobody consumes), else an empty string.
std::string graph_problem(const std::vector<StageDecl>& stages);

/// The most threads the graph of `stages` can keep busy at once on `threads` graph threads:
/// that many invocations running together, the ones using the most threads (intra-op math)
/// first, each stage at the concurrency it can reach.
std::size_t peak_threads(const std::vector<StageDecl>& stages, std::size_t threads);

/// Returns a one-line problem if the busiest moment of `stages` run with `options` (threads and
/// cores; 0: one per hardware thread) would need more threads than the cores granted, else an
/// empty string. Checked when a config is loaded (every phase, before the first runs) and again
/// by Pipeline::run.
std::string thread_budget_problem(const std::vector<StageDecl>& stages, const RunOptions& options);

/// The graph as text, one line per stage with its kind, inputs and options, for `flowtrain check`:
///   numbers   source                       concurrency 1
///   square    map      <- numbers          concurrency 4, queue 16
std::string graph_text(const std::vector<StageDecl>& stages);


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
///   p.add("numbers", std::make_unique<Count>());
///   p.add("square", std::make_unique<Square>(), {.concurrency = 4, .queue_capacity = 16});
///   p.add("print", std::make_unique<Print>(), {.ordered = true});
///   RunReport report = p.run({.threads = 2});
///   std::cout << format_report(report);
///
/// An exception in any stage cancels the graph and is rethrown from run() as a StageError naming
/// the stage and the item.
class Pipeline {
 public:
  Pipeline();
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  /// Adds a stage taking its inputs from `options.inputs` (default: the stage added before);
  /// throws Error with add_problem's message if it cannot (item types, kinds, unknown inputs,
  /// concurrency above the stage's maximum or above this stage's queue capacity).
  Pipeline& add(std::string name, std::unique_ptr<Stage> stage, StageOptions options = {});

  /// The stages as added, for graph_text and checks.
  std::vector<StageDecl> decls() const;

  /// Runs the graph to completion (sources exhausted or stopped, every item drained).
  /// Before it starts: seeks the source where a stage restored from a checkpoint asks
  /// (Stage::resume_position), tells each stage how many items to expect (Stage::plan), and
  /// checks the thread budget. A pipeline runs once.
  RunReport run(const RunOptions& options = {});

  /// Asks the sources to stop; items already produced are finished. Async-signal-safe, may be
  /// called from any thread or a signal handler, before or during run().
  void request_stop() noexcept { stop_.store(true, std::memory_order_relaxed); }

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
  // Seeks the source to the position a resuming stage asks for, then plans the item counts.
  void prepare();

  std::vector<Node> nodes_;
  std::atomic<bool> stop_{false};
  bool ran_ = false;
  std::uint64_t expected_ = 0;  // items the last sink expects, from prepare() (0: unknown)
};

/// Stops `pipeline` on SIGINT and SIGTERM while in scope; a second signal ends the process the
/// default way. Restores the previous handlers on destruction. One at a time per process.
class StopOnSignal {
 public:
  explicit StopOnSignal(Pipeline& pipeline);
  ~StopOnSignal();
  /// The signal that stopped the pipeline (SIGINT or SIGTERM), or 0.
  int received() const;
  StopOnSignal(const StopOnSignal&) = delete;
  StopOnSignal& operator=(const StopOnSignal&) = delete;
};

}  // namespace flowtrain
