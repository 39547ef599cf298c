#include "graph/pipeline.hpp"

#include <oneapi/tbb/flow_graph.h>
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/info.h>
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <csignal>
#include <exception>
#include <functional>
#include <optional>
#include <type_traits>

#include "graph/error.hpp"
#include "graph/metrics.hpp"
#include "graph/trace.hpp"

namespace flowtrain {

namespace detail {
// The one door into a stage's private type-erased entry points.
struct StageAccess {
  static std::shared_ptr<void> next(Stage& s) { return s.next_erased(); }
  static std::shared_ptr<void> map(Stage& s, std::shared_ptr<void>& v, ItemContext& ctx) {
    return s.map_erased(v, ctx);
  }
  static void flat_map(Stage& s, std::shared_ptr<void>& v, EmitSink& out) {
    s.flat_map_erased(v, out);
  }
  static void finish(Stage& s, EmitSink& out) { s.finish_erased(out); }
  static void consume(Stage& s, std::shared_ptr<void>& v, ItemContext& ctx) {
    s.consume_erased(v, ctx);
  }
};
}  // namespace detail

using Kind = StageShape::Kind;

namespace {

std::string concurrency_text(std::size_t c) {
  return c == kUnlimited ? "unlimited" : std::to_string(c);
}

std::string what_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception";
  }
}

}  // namespace

std::string options_problem(const StageShape& shape, const StageOptions& options) {
  if (shape.max_concurrency != kUnlimited &&
      (options.concurrency == kUnlimited || options.concurrency > shape.max_concurrency)) {
    return "concurrency " + concurrency_text(options.concurrency) + " is not allowed: a " +
           to_string(shape.kind) + " runs serially";
  }
  if (shape.kind != Kind::kSource && options.queue_capacity < 1) {
    return "queue_capacity must be at least 1";
  }
  return {};
}

std::string link_problem(const std::string& prev_name,
                         const StageShape& prev,
                         const StageOptions& prev_options,
                         const std::string& next_name,
                         const StageShape& next,
                         const StageOptions& next_options) {
  if (prev.kind == Kind::kSink) {
    return "stage '" + next_name + "' follows the sink '" + prev_name +
           "'; a sink must be the last stage";
  }
  if (next.kind == Kind::kSource) {
    return "source '" + next_name + "' must be the first stage, but follows '" + prev_name + "'";
  }
  if (!next.input.accepts(prev.output)) {
    return "item type mismatch: '" + next_name + "' takes " + next.input.name() + ", but '" +
           prev_name + "' emits " + prev.output.name();
  }
  if (prev_options.concurrency == kUnlimited) return {};
  if (prev_options.concurrency > next_options.queue_capacity) {
    return "queue_capacity " + std::to_string(next_options.queue_capacity) + " of '" + next_name +
           "' is below the concurrency " + std::to_string(prev_options.concurrency) + " of '" +
           prev_name + "': each worker of '" + prev_name +
           "' needs an output slot; raise queue_capacity or lower concurrency";
  }
  return {};
}

Pipeline::Pipeline() = default;
Pipeline::~Pipeline() = default;

Pipeline& Pipeline::add(std::string name, std::unique_ptr<Stage> stage, StageOptions options) {
  if (!stage) throw Error("stage '" + name + "' is null");
  const StageShape shape = stage->shape();
  if (std::string problem = options_problem(shape, options); !problem.empty()) {
    throw Error("stage '" + name + "': " + problem);
  }
  if (nodes_.empty()) {
    if (shape.kind != Kind::kSource) {
      throw Error("the first stage '" + name + "' must be a source, not a " +
                  to_string(shape.kind));
    }
  } else {
    const Node& prev = nodes_.back();
    if (std::string problem =
            link_problem(prev.name, prev.shape, prev.options, name, shape, options);
        !problem.empty()) {
      throw Error(problem);
    }
  }
  for (const Node& node : nodes_) {
    if (node.name == name) throw Error("two stages are named '" + name + "'");
  }
  if (stage->requires_order()) options.ordered = true;
  nodes_.push_back({std::move(name), std::move(stage), shape, options});
  return *this;
}

// One run of a pipeline: the TBB graph, the counters and the sampler.
//
// Every edge i -> i+1 is bounded by a limiter_node ("gate") in front of stage i that admits an
// item only while fewer than queue_capacity(i+1) items are in production in stage i or waiting
// for stage i+1. Stage i+1 returns the slot when it starts the item. The source's gate sits
// after the source, whose input_node then holds its one produced item and stops calling next().
//
//   source -> gate0 -> buf1 -> gate1 -> stage1 ~~> buf2 -> gate2 -> stage2 ~~> buf3 -> sink
//                                    (stage bodies put their outputs into the next buffer: ~~>)
//
// A buffer is a sequencer_node where the stage (or one downstream of it, up to a FlatMap) needs
// items in order, so that an out-of-order item can never hold the slot its predecessor needs.
class Pipeline::Runtime {
 public:
  Runtime(Pipeline& pipeline, const RunOptions& options)
      : nodes_(pipeline.nodes_),
        stop_(pipeline.stop_),
        key_prefix_(options.key_prefix),
        threads_(options.threads > 0 ? options.threads : hardware_threads()),
        // Unless granted explicitly, the cores are the machine's (or `threads`, if more).
        cores_(options.cores > 0 ? options.cores : std::max(hardware_threads(), threads_)),
        start_(detail::Clock::now()) {
    if (peak_threads() > cores_) throw Error(budget_problem());
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      counters_.push_back(std::make_unique<detail::StageCounters>());
    }
    if (!options.trace_path.empty()) trace_.emplace(start_);
    sampler_.emplace(counters_, geometry(), options.sample_interval_ms, start_, options.on_progress,
                     options.progress_interval_s, pipeline.expected_);
  }

  RunReport run(const std::string& trace_path) {
    std::exception_ptr error;
    // TBB sizes its worker pool to the hardware; the control lets `threads` above that (or
    // below it) take effect for the arena of this run.
    tbb::global_control workers(tbb::global_control::max_allowed_parallelism, threads_);
    tbb::task_arena arena(static_cast<int>(threads_));
    arena.execute([&] {
      Graph graph(*this);
      graph_ = &graph;
      try {
        graph.source->activate();
        graph.g.wait_for_all();
        for (std::size_t i = 1; i + 1 < nodes_.size(); ++i) {
          if (nodes_[i].shape.kind != Kind::kFlatMap) continue;
          finish(i);
          graph.g.wait_for_all();
        }
        finish_sink();
      } catch (...) {
        error = std::current_exception();
      }
      graph_ = nullptr;
    });
    sampler_->stop();
    if (error) std::rethrow_exception(error);
    RunReport report = make_report();
    if (trace_) {
      trace_->write(trace_path, report);
      report.trace_path = trace_path;
    }
    return report;
  }

 private:
  using Gate = tbb::flow::limiter_node<Item, long long>;
  using Buffer = tbb::flow::queue_node<Item>;
  using Worker = tbb::flow::function_node<Item, tbb::flow::continue_msg>;

  // The flow graph proper; built inside the task arena so its tasks run there. Nodes are
  // declared after the graph so they are destroyed before it.
  struct Graph {
    tbb::flow::graph g;
    std::unique_ptr<tbb::flow::input_node<Item>> source;
    std::vector<std::unique_ptr<Gate>> gates;      // [i]: slots of stage i's output; none for sink
    std::vector<std::unique_ptr<Buffer>> buffers;  // [i]: input of stage i; none for source
    std::vector<std::unique_ptr<Worker>> workers;  // [i]: body of stage i; none for source

    explicit Graph(Runtime& rt) {
      const std::vector<Node>& nodes = rt.nodes_;
      const std::size_t n = nodes.size();
      const std::vector<bool> in_order = ordered_inputs(nodes);
      source = std::make_unique<tbb::flow::input_node<Item>>(
          g, [&rt](tbb::flow_control& fc) { return rt.produce(fc); });
      gates.resize(n);
      buffers.resize(n);
      workers.resize(n);
      for (std::size_t i = 0; i + 1 < n; ++i) {
        gates[i] = std::make_unique<Gate>(g, nodes[i + 1].options.queue_capacity);
      }
      for (std::size_t i = 1; i < n; ++i) {
        if (in_order[i]) {
          buffers[i] = std::make_unique<tbb::flow::sequencer_node<Item>>(
              g, [](const Item& item) { return static_cast<std::size_t>(item.seq); });
        } else {
          buffers[i] = std::make_unique<Buffer>(g);
        }
        // TBB passes messages by const reference; the stored copy is ours to move from.
        workers[i] =
            std::make_unique<Worker>(g, nodes[i].options.concurrency, [&rt, i](const Item& item) {
              rt.handle(i, const_cast<Item&>(item));
              return tbb::flow::continue_msg();
            });
      }
      tbb::flow::make_edge(*source, *gates[0]);
      tbb::flow::make_edge(*gates[0], *buffers[1]);
      for (std::size_t i = 1; i < n; ++i) {
        if (gates[i]) {
          tbb::flow::make_edge(*buffers[i], *gates[i]);
          tbb::flow::make_edge(*gates[i], *workers[i]);
        } else {
          tbb::flow::make_edge(*buffers[i], *workers[i]);
        }
      }
    }
  };

  // Which stages must receive their input in sequence order: those asked to, and every stage
  // upstream of one that must, back to the nearest FlatMap (which renumbers its outputs).
  static std::vector<bool> ordered_inputs(const std::vector<Node>& nodes) {
    std::vector<bool> in_order(nodes.size());
    for (std::size_t i = nodes.size(); i-- > 1;) {
      in_order[i] = nodes[i].options.ordered || (i + 1 < nodes.size() && in_order[i + 1] &&
                                                 nodes[i].shape.kind != Kind::kFlatMap);
    }
    return in_order;
  }

  static std::size_t hardware_threads() {
    return static_cast<std::size_t>(tbb::info::default_concurrency());
  }

  // The most threads the graph can keep busy at once: `threads_` invocations running together,
  // the ones using the most threads (intra-op math) first.
  std::size_t peak_threads() const {
    std::vector<std::size_t> slots;
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      slots.insert(slots.end(), workers(i), nodes_[i].stage->threads_per_invocation());
    }
    std::sort(slots.begin(), slots.end(), std::greater<>());
    slots.resize(std::min(slots.size(), threads_));
    std::size_t sum = 0;
    for (std::size_t n : slots) sum += n;
    return sum;
  }

  std::string budget_problem() const {
    std::string heavy;
    for (const Node& node : nodes_) {
      const std::size_t n = node.stage->threads_per_invocation();
      if (n > 1) heavy += ", '" + node.name + "' " + std::to_string(n) + " intra-op threads";
    }
    return "thread budget: up to " + std::to_string(peak_threads()) +
           " threads could run at once (" + std::to_string(threads_) + " graph threads" + heavy +
           "), more than the " + std::to_string(cores_) +
           " cores granted; lower threads or a stage's intraop_threads, or raise cores";
  }

  std::vector<detail::StageGeometry> geometry() const {
    std::vector<detail::StageGeometry> out;
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      const bool last = i + 1 == nodes_.size();
      detail::StageGeometry geo;
      geo.workers = workers(i);
      geo.out_capacity = last ? 0 : nodes_[i + 1].options.queue_capacity;
      geo.has_input = i > 0;
      geo.name = nodes_[i].name;
      geo.stage = nodes_[i].stage.get();
      out.push_back(geo);
    }
    return out;
  }

  // The concurrency stage i can reach: its own, the threads, and its output slots.
  std::size_t workers(std::size_t i) const {
    std::size_t w = nodes_[i].options.concurrency == kUnlimited
                        ? threads_
                        : std::min(nodes_[i].options.concurrency, threads_);
    if (i + 1 < nodes_.size()) w = std::min(w, nodes_[i + 1].options.queue_capacity);
    return std::max<std::size_t>(w, 1);
  }

  // Puts stage i's output on the edge to stage i+1.
  void push(std::size_t i, Item item) {
    counters_[i]->emitted.fetch_add(1, std::memory_order_relaxed);
    graph_->buffers[i + 1]->try_put(item);
  }

  // Outputs of a FlatMap: fresh sequence numbers, and one output slot each. The item that was
  // admitted holds one slot; each further output takes another (and no output frees it).
  class FlatEmit final : public EmitSink {
   public:
    FlatEmit(Runtime& rt, std::size_t stage, bool holds_slot)
        : rt_(rt), stage_(stage), holds_slot_(holds_slot) {}
    ~FlatEmit() {
      if (holds_slot_) rt_.graph_->gates[stage_]->decrementer().try_put(1);
    }
    void emit(std::shared_ptr<void> value) override {
      if (!holds_slot_) rt_.graph_->gates[stage_]->decrementer().try_put(-1);
      holds_slot_ = false;
      rt_.counters_[stage_]->items_out.fetch_add(1, std::memory_order_relaxed);
      rt_.push(stage_, Item{rt_.next_seq_[stage_]++, std::move(value)});
    }

   private:
    Runtime& rt_;
    std::size_t stage_;
    bool holds_slot_;
  };

  Item produce(tbb::flow_control& fc) {
    if (stop_.load(std::memory_order_relaxed)) {
      fc.stop();
      return {};
    }
    std::shared_ptr<void> value =
        invoke(0, next_seq_[0], [&] { return detail::StageAccess::next(*nodes_[0].stage); });
    if (!value) {
      fc.stop();
      return {};
    }
    counters_[0]->emitted.fetch_add(1, std::memory_order_relaxed);
    counters_[0]->items_out.fetch_add(1, std::memory_order_relaxed);
    return Item{next_seq_[0]++, std::move(value)};
  }

  void handle(std::size_t i, Item& in) {
    detail::StageCounters& c = *counters_[i];
    c.started.fetch_add(1, std::memory_order_relaxed);
    graph_->gates[i - 1]->decrementer().try_put(1);  // the item left stage i-1's output queue
    Stage& stage = *nodes_[i].stage;
    const Kind kind = nodes_[i].shape.kind;

    if (!in.value) {  // a tombstone: keep the sequence whole, do no work
      if (kind == Kind::kMap) push(i, Item{in.seq, nullptr});
      if (kind == Kind::kFlatMap) graph_->gates[i]->decrementer().try_put(1);
      return;
    }
    c.items_in.fetch_add(1, std::memory_order_relaxed);
    ItemContext ctx(in.seq);
    switch (kind) {
      case Kind::kMap: {
        std::shared_ptr<void> out =
            invoke(i, in.seq, [&] { return detail::StageAccess::map(stage, in.value, ctx); });
        in.value.reset();
        if (out) {
          c.items_out.fetch_add(1, std::memory_order_relaxed);
        } else {
          c.record_drop(in.seq, ctx.drop_reason().value_or("dropped by the stage"));
        }
        push(i, Item{in.seq, std::move(out)});
        break;
      }
      case Kind::kFlatMap: {
        FlatEmit emit(*this, i, /*holds_slot=*/true);
        invoke(i, in.seq, [&] {
          detail::StageAccess::flat_map(stage, in.value, emit);
          return 0;
        });
        break;
      }
      case Kind::kSink:
        invoke(i, in.seq, [&] {
          detail::StageAccess::consume(stage, in.value, ctx);
          return 0;
        });
        if (ctx.drop_reason()) c.record_drop(in.seq, *ctx.drop_reason());
        break;
      case Kind::kSource:
        break;
    }
  }

  void finish(std::size_t i) {
    FlatEmit emit(*this, i, /*holds_slot=*/false);
    invoke(i, next_seq_[i], [&] {
      detail::StageAccess::finish(*nodes_[i].stage, emit);
      return 0;
    });
  }

  void finish_sink() {
    struct NoOutput final : EmitSink {
      void emit(std::shared_ptr<void>) override { throw Error("a sink cannot emit"); }
    } none;
    const std::size_t last = nodes_.size() - 1;
    invoke(last, 0, [&] {
      detail::StageAccess::finish(*nodes_[last].stage, none);
      return 0;
    });
  }

  // Runs stage code with timing, concurrency tracking and error context.
  template <class F>
  std::invoke_result_t<F&> invoke(std::size_t i, std::uint64_t seq, F&& body) {
    detail::StageCounters& c = *counters_[i];
    c.enter();
    const auto begin = detail::Clock::now();
    try {
      auto result = body();
      const auto end = detail::Clock::now();
      c.leave(end - begin);
      if (trace_) trace_->span(static_cast<std::uint32_t>(i), seq, begin, end);
      return result;
    } catch (...) {
      c.leave(detail::Clock::now() - begin);
      throw StageError(nodes_[i].name, seq, what_of(std::current_exception()));
    }
  }

  RunReport make_report() {
    RunReport report;
    report.wall_s = std::chrono::duration<double>(detail::Clock::now() - start_).count();
    report.threads = threads_;
    report.cores = cores_;
    report.peak_threads = peak_threads();
    report.stopped = stop_.load();
    report.key_prefix = key_prefix_;
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      detail::StageCounters& c = *counters_[i];
      StageReport s;
      s.name = nodes_[i].name;
      s.kind = nodes_[i].shape.kind;
      s.concurrency = nodes_[i].options.concurrency;
      s.max_concurrency = nodes_[i].shape.max_concurrency;
      s.workers = workers(i);
      s.queue_capacity = i == 0 ? 0 : nodes_[i].options.queue_capacity;
      s.threads_per_invocation = nodes_[i].stage->threads_per_invocation();
      s.results = nodes_[i].stage->results();
      s.items_in = c.items_in.load();
      s.items_out = c.items_out.load();
      {
        std::lock_guard lock(c.drops_mutex);
        s.dropped = c.dropped;
        s.drops = c.drops;
      }
      s.busy_s = static_cast<double>(c.busy_ns.load()) / 1e9;
      s.busy_fraction =
          report.wall_s > 0 ? s.busy_s / (report.wall_s * static_cast<double>(s.workers)) : 0;
      s.peak_active = c.peak_active.load();
      report.stages.push_back(std::move(s));
    }
    sampler_->fill(report);
    return report;
  }

  std::vector<Node>& nodes_;
  std::atomic<bool>& stop_;
  const std::string key_prefix_;
  const std::size_t threads_;
  const std::size_t cores_;
  const detail::Clock::time_point start_;
  std::vector<std::unique_ptr<detail::StageCounters>> counters_;
  // Next sequence number a source or FlatMap assigns (both are serial).
  std::vector<std::uint64_t> next_seq_ = std::vector<std::uint64_t>(nodes_.size(), 0);
  std::optional<detail::TraceRecorder> trace_;
  std::optional<detail::Sampler> sampler_;
  Graph* graph_ = nullptr;
};

RunReport Pipeline::run(const RunOptions& options) {
  if (ran_) throw Error("a pipeline runs once; build a new one to run again");
  if (nodes_.size() < 2 || nodes_.back().shape.kind != Kind::kSink) {
    throw Error("a pipeline needs a source first and a sink last; the last stage '" +
                (nodes_.empty() ? std::string("(none)") : nodes_.back().name) + "' is not a sink");
  }
  ran_ = true;
  prepare();
  Runtime runtime(*this, options);
  return runtime.run(options.trace_path);
}

void Pipeline::prepare() {
  // Resume: every stage that restored a checkpoint must agree on where the source restarts.
  std::optional<std::uint64_t> position;
  std::string asked_by;
  for (const Node& node : nodes_) {
    const std::optional<std::uint64_t> p = node.stage->resume_position();
    if (!p) continue;
    if (position && *p != *position) {
      throw Error("stages '" + asked_by + "' and '" + node.name +
                  "' resume from different source positions (" + std::to_string(*position) +
                  " and " + std::to_string(*p) + "); their checkpoints are from different runs");
    }
    position = p;
    asked_by = node.name;
  }
  if (position && *position > 0 && !nodes_[0].stage->seek(*position)) {
    throw Error("stage '" + asked_by + "' resumes from source position " +
                std::to_string(*position) + ", but source '" + nodes_[0].name +
                "' cannot seek; use a dataset source or start without the checkpoint");
  }
  // The count each stage passes on; what reaches the sink is what the progress line expects.
  std::optional<std::uint64_t> expected;
  for (const Node& node : nodes_) {
    if (&node == &nodes_.back()) expected_ = expected.value_or(0);
    expected = node.stage->plan(expected);
  }
}

namespace {
std::atomic<Pipeline*> g_signal_target{nullptr};
struct sigaction g_previous_int;
struct sigaction g_previous_term;

extern "C" void on_stop_signal(int signal) {
  if (Pipeline* p = g_signal_target.load()) p->request_stop();
  // A second signal ends the process the default way.
  std::signal(signal, SIG_DFL);
}
}  // namespace

StopOnSignal::StopOnSignal(Pipeline& pipeline) {
  g_signal_target.store(&pipeline);
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, &g_previous_int);
  sigaction(SIGTERM, &action, &g_previous_term);
}

StopOnSignal::~StopOnSignal() {
  sigaction(SIGINT, &g_previous_int, nullptr);
  sigaction(SIGTERM, &g_previous_term, nullptr);
  g_signal_target.store(nullptr);
}

}  // namespace flowtrain
