// Building a run's flow graph (graph/runtime.hpp), running it in its task arena, and its report.

#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/task_arena.h>

#include "graph/atomic_file.hpp"
#include "graph/checks.hpp"
#include "graph/cpu_usage.hpp"
#include "graph/error.hpp"
#include "graph/run_state.hpp"
#include "graph/runtime.hpp"

namespace flowtrain {

using detail::has_ports;
using detail::numbered_by;
using detail::out_capacity;
using detail::pulled;
using detail::reachable_workers;

Pipeline::Runtime::Runtime(Pipeline& pipeline, const RunOptions& options)
    : nodes_(pipeline.nodes_),
      decls_(pipeline.decls()),
      halt_(pipeline.halt_),
      counters_(pipeline.state_->counters),
      next_seq_(pipeline.state_->next_seq),
      drop_log_(pipeline.state_->drop_log),
      earlier_wall_s_(pipeline.state_->earlier_wall_s),
      source_(pipeline.state_->source),
      key_prefix_(options.key_prefix),
      threads_(threads_and_cores(options).first),
      cores_(threads_and_cores(options).second),
      start_(detail::Clock::now()),
      consumers_(nodes_.size()) {
  for (std::size_t c = 0; c < nodes_.size(); ++c) {
    const std::vector<InputLink>& in = nodes_[c].inputs;
    for (std::size_t port = 0; port < in.size(); ++port) {
      consumers_[in[port].stage].push_back({c, port, in[port].output});
    }
  }
  // The same slots the thread budget and the checks count with.
  for (std::size_t i = 0; i < nodes_.size(); ++i)
    out_capacity_.push_back(out_capacity(decls_, i));
  if (std::string problem = thread_budget_problem(decls_, options); !problem.empty()) {
    throw Error(problem);
  }
  if (nodes_[source_].shape.kind == Kind::kMix) {
    mix_ = static_cast<const MixStage*>(nodes_[source_].stage.get());
    mix_alive_.assign(nodes_[source_].inputs.size(), true);
  }
  // Where each numbering stage starts this run: sequencers and joins count from there.
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    if (!pulled(nodes_[i].shape.kind)) {
      seq_base_[i] = next_seq_[numbered_by(decls_, nodes_[i].inputs.front().stage)];
    }
  }
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    if (nodes_[i].options.token_from.empty()) continue;
    tokens_[i] = std::make_unique<TokenState>();
    for (std::size_t s = 0; s < nodes_.size(); ++s) {
      if (nodes_[s].name == nodes_[i].options.token_from) token_receivers_[s].push_back(i);
    }
  }
  // A stage after one that waits for tokens must finish what it gets, or a token taken
  // would never come back (nodes_ lists inputs before the stages taking them).
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    for (const InputLink& in : nodes_[i].inputs) {
      if (tokens_[in.stage] || !may_discard_[in.stage]) may_discard_[i] = false;
    }
  }
  if (!options.trace_path.empty()) {
    check_can_write_atomically(options.trace_path);  // before the run, not after it
    trace_.emplace(start_);
  }
  sampler_.emplace(counters_, geometry(), options.sample_interval_ms, start_, options.on_progress,
                   options.progress_interval_s, pipeline.expected_);
}

RunReport Pipeline::Runtime::run(const RunOptions& options) {
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
      check_no_parked_items();
      // A paused run is not over: the stages keep what they hold (a partial batch) for the
      // next run, which continues the stream.
      if (!paused()) {
        for (std::size_t i = 0; i < nodes_.size(); ++i) {
          if (nodes_[i].shape.kind != Kind::kFlatMap) continue;
          finish(i);
          graph.g.wait_for_all();
        }
        check_no_parked_items();
        for (std::size_t i = 0; i < nodes_.size(); ++i) {
          if (nodes_[i].shape.kind == Kind::kSink) finish_sink(i);
        }
      }
    } catch (...) {
      error = std::current_exception();
    }
    graph_ = nullptr;
  });
  sampler_->stop();
  if (error) {
    std::lock_guard lock(first_error_mutex_);
    std::rethrow_exception(first_error_ ? first_error_ : error);
  }
  RunReport report = make_report();
  if (trace_) {
    trace_->write(options.trace_path, report);
    report.trace_path = options.trace_path;
  }
  if (drop_log_ && !report.paused) report.drops_path = drop_log_->close();
  return report;
}

Pipeline::Runtime::Graph::Graph(Runtime& rt) {
  const std::vector<Node>& nodes = rt.nodes_;
  const std::size_t n = nodes.size();
  const std::vector<bool> in_order = rt.ordered_inputs();
  // A sequencer counts from 0: the item numbers of this run start at its stage's base.
  auto sequencer = [this](std::uint64_t base) {
    return std::make_unique<Sequencer>(
        g, [base](const Message& m) { return static_cast<std::size_t>(m.seq - base); });
  };
  source = std::make_unique<tbb::flow::input_node<Message>>(
      g, [&rt](tbb::flow_control& fc) { return rt.produce(fc); });
  distribute = std::make_unique<Worker>(g, tbb::flow::unlimited, [&rt](const Message& m) {
    rt.push(rt.source_, std::move(const_cast<Message&>(m)));
    return tbb::flow::continue_msg();
  });
  gates.resize(n);
  buffers.resize(n);
  workers.resize(n);
  ports.resize(n);
  collectors.resize(n);
  joins.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (rt.out_capacity_[i] > 0) gates[i] = std::make_unique<Gate>(g, rt.out_capacity_[i]);
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (pulled(nodes[i].shape.kind)) continue;
    if (has_ports(nodes[i].shape.kind)) {
      auto state = std::make_unique<JoinState>();
      state->base = rt.seq_base_[i];
      state->arrived.assign(nodes[i].inputs.size(), state->base);
      joins[i] = std::move(state);
      for (std::size_t port = 0; port < nodes[i].inputs.size(); ++port) {
        ports[i].push_back(sequencer(rt.seq_base_[i]));
        collectors[i].push_back(
            std::make_unique<Worker>(g, tbb::flow::serial, [&rt, i, port](const Message& m) {
              rt.collect(i, port, const_cast<Message&>(m));
              return tbb::flow::continue_msg();
            }));
        tbb::flow::make_edge(*ports[i].back(), *collectors[i].back());
      }
      // Complete sets are put in sequence order, under the collector's lock.
      buffers[i] = std::make_unique<Buffer>(g);
    } else if (in_order[i]) {
      buffers[i] = sequencer(rt.seq_base_[i]);
    } else {
      buffers[i] = std::make_unique<Buffer>(g);
    }
    // TBB passes messages by const reference; the stored copy is ours to move from.
    workers[i] = std::make_unique<Worker>(
        g, nodes[i].options.concurrency, [&rt, i](const Message& m) {
          rt.handle(i, const_cast<Message&>(m));
          return tbb::flow::continue_msg();
        });
  }
  tbb::flow::make_edge(*source, *gates[rt.source_]);
  tbb::flow::make_edge(*gates[rt.source_], *distribute);
  for (std::size_t i = 0; i < n; ++i) {
    if (pulled(nodes[i].shape.kind)) continue;
    if (gates[i]) {
      tbb::flow::make_edge(*buffers[i], *gates[i]);
      tbb::flow::make_edge(*gates[i], *workers[i]);
    } else {
      tbb::flow::make_edge(*buffers[i], *workers[i]);
    }
  }
}

std::vector<bool> Pipeline::Runtime::ordered_inputs() const {
  std::vector<bool> in_order(nodes_.size());
  for (std::size_t i = nodes_.size(); i-- > 1;) {
    bool downstream = false;
    for (const Consumer& c : consumers_[i]) {
      downstream = downstream || in_order[c.stage] || has_ports(nodes_[c.stage].shape.kind);
    }
    in_order[i] =
        nodes_[i].options.ordered || (downstream && nodes_[i].shape.kind != Kind::kFlatMap);
  }
  return in_order;
}

std::vector<detail::StageGeometry> Pipeline::Runtime::geometry() const {
  std::vector<detail::StageGeometry> out;
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    detail::StageGeometry geo;
    geo.workers = workers(i);
    geo.out_capacity = out_capacity_[i];
    // A mix is pulled like a source: it always has input.
    if (nodes_[i].shape.kind != Kind::kMix) {
      for (const InputLink& link : nodes_[i].inputs) geo.inputs.push_back(link.stage);
    }
    for (const Consumer& c : consumers_[i]) geo.consumers.push_back(c.stage);
    geo.name = nodes_[i].name;
    geo.stage = nodes_[i].stage.get();
    out.push_back(geo);
  }
  return out;
}

std::size_t Pipeline::Runtime::workers(std::size_t i) const {
  return reachable_workers(nodes_[i].options.concurrency, threads_, out_capacity_[i]);
}

RunReport Pipeline::Runtime::make_report() {
  RunReport report;
  report.wall_s =
      earlier_wall_s_ + std::chrono::duration<double>(detail::Clock::now() - start_).count();
  report.paused = paused();
  report.threads = threads_;
  report.cores = cores_;
  report.peak_threads = peak_threads(decls_, threads_);
  report.stopped = stopped();
  report.key_prefix = key_prefix_;
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    detail::StageCounters& c = *counters_[i];
    StageReport s;
    s.name = nodes_[i].name;
    s.kind = nodes_[i].shape.kind;
    s.concurrency = nodes_[i].options.concurrency;
    s.max_concurrency = nodes_[i].shape.max_concurrency;
    s.workers = workers(i);
    s.queue_capacity = pulled(nodes_[i].shape.kind) ? 0 : nodes_[i].options.queue_capacity;
    s.threads_per_invocation = nodes_[i].stage->threads_per_invocation();
    s.intra_op_parallel = nodes_[i].stage->intra_op_parallel();
    {
      const ItemType& item = pulled(s.kind) ? nodes_[i].shape.output : nodes_[i].shape.input;
      s.item = item.name();
      if (const std::size_t colon = s.item.rfind("::"); colon != std::string::npos) {
        s.item.erase(0, colon + 2);
      }
    }
    s.results = nodes_[i].stage->results();
    s.waiting = nodes_[i].stage->waiting();
    s.timeline = nodes_[i].stage->timeline();
    const double start_s = std::chrono::duration<double>(start_.time_since_epoch()).count();
    for (TimelineSpan& span : s.timeline) {
      span.begin_s -= start_s;
      span.end_s -= start_s;
    }
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

RunReport Pipeline::run(const RunOptions& options) {
  if (ran_ && !paused_) throw Error("a pipeline runs once; build a new one to run again");
  std::vector<std::vector<InputLink>> links = resolve_inputs();
  for (std::size_t i = 0; i < nodes_.size(); ++i) nodes_[i].inputs = std::move(links[i]);
  if (!ran_) {
    ran_ = true;
    prepare();
    state_ = std::make_unique<RunState>(nodes_, options);
    published_.store(state_.get(), std::memory_order_release);
  }
  halt_.fetch_and(~(kPaused | kDiscard), std::memory_order_relaxed);
  paused_ = false;  // a run that fails leaves stages that cannot go on
  Runtime runtime(*this, options);
  RunReport report = runtime.run(options);
  paused_ = report.paused;
  // The report covers every run since the first: its CPU figures too, not this run's alone.
  detail::append_cpu(state_->earlier_cpu, state_->earlier_wall_s, std::move(report.cpu),
                     report.wall_s - state_->earlier_wall_s);
  report.cpu = state_->earlier_cpu;
  state_->earlier_wall_s = report.wall_s;
  return report;
}

}  // namespace flowtrain
