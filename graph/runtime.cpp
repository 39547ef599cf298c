// The runtime: one run of a Pipeline as a oneTBB flow graph (Pipeline::Runtime), its gates,
// buffers, joins, tokens and sampler.
#include <oneapi/tbb/flow_graph.h>
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/info.h>
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <csignal>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <type_traits>

#include "graph/atomic_file.hpp"
#include "graph/checks.hpp"
#include "graph/cpu_usage.hpp"
#include "graph/error.hpp"
#include "graph/metrics.hpp"
#include "graph/mix.hpp"
#include "graph/run_state.hpp"
#include "graph/trace.hpp"

namespace flowtrain {

namespace detail {
// The one door into a stage's private type-erased entry points.
struct StageAccess {
  static std::shared_ptr<void> next(Stage& s) { return s.next_erased(); }
  static void mixed_at(Stage& s, std::shared_ptr<void>& v, std::uint64_t position) {
    s.mixed_at_erased(v, position);
  }
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
  static std::shared_ptr<void> join(Stage& s,
                                    std::vector<std::shared_ptr<void>>& parts,
                                    ItemContext& ctx) {
    return s.join_erased(parts, ctx);
  }
  static std::shared_ptr<void> route(Stage& s,
                                     std::shared_ptr<void>& v,
                                     ItemContext& ctx,
                                     std::size_t& output) {
    return s.route_erased(v, ctx, output);
  }
  static std::shared_ptr<void> copy_input(const Stage& s, const std::shared_ptr<void>& v) {
    return s.copy_input_erased(v);
  }
};
}  // namespace detail

using Kind = StageShape::Kind;
using detail::emitted;
using detail::has_ports;
using detail::numbered_by;
using detail::out_capacity;
using detail::pulled;
using detail::reachable_workers;

namespace {

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

namespace {

// A message on an edge: an item's sequence number and a shared handle to its value. TBB's flow
// graph copies messages between nodes; copying one copies pointers, never the value. A null
// `value` is a tombstone: the item was dropped upstream, and it still flows so that ordered
// stages and joins downstream see no gap in the sequence.
struct Message {
  std::uint64_t seq = 0;
  std::shared_ptr<void> value;
  std::uint32_t from = 0;  // the stage that emitted it: its output slot is held until started
  // With several consumers: how many have yet to start it (the last one returns the slot).
  std::shared_ptr<std::atomic<std::uint32_t>> sharers;
  bool granted = false;  // it waited for a token and got one (StageOptions::token_from)
};

// What a join's worker receives: one message per input, in the order of its inputs.
struct JoinedParts {
  std::vector<Message> parts;
};

}  // namespace

// One run of a pipeline: the TBB graph and the sampler; the counters are the pipeline's.
//
// Every stage with consumers has a limiter_node ("gate") in front of its body that admits an
// item only while fewer than `out_capacity` items are in production in the stage or waiting
// for one of its consumers, where out_capacity is the smallest queue_capacity among them. A
// consumer returns the slot when it starts the item; with several consumers, the last one to
// start it does. The source's gate sits after the source, whose input_node then holds its one
// produced item and stops calling next().
//
//   source -> gate0 => buf1 -> gate1 -> stage1 ~~> buf2 -> gate2 -> stage2 ~~> buf3 -> sink
//                                    (stage bodies put their outputs into consumers' buffers: ~~>)
//
// A buffer is a sequencer_node where the stage (or one downstream of it, up to a FlatMap) needs
// items in order, so that an out-of-order item can never hold the slot its predecessor needs. A
// join has one sequencer per input ("port"), each feeding a serial collector that pairs items
// by sequence number and puts complete sets into the join's buffer. Since every port receives
// its items in order, only one side of a join can be ahead, and the items the other side lacks
// hold slots upstream of it: they are in production and arrive; no capacity can deadlock it.
class Pipeline::Runtime {
 public:
  Runtime(Pipeline& pipeline, const RunOptions& options)
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

  RunReport run(const RunOptions& options) {
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

  // Stopped early on request (request_stop: SIGINT, SIGTERM).
  bool stopped() const { return (halt_.load(std::memory_order_relaxed) & kStopped) != 0; }
  // Paused (Pipeline::request_pause) rather than stopped or run to its end.
  bool paused() const {
    return (halt_.load(std::memory_order_relaxed) & ~kDiscard) == kPaused;
  }
  // Paused by request_pause_discarding: items not yet started are thrown away.
  bool discarding() const { return (halt_.load(std::memory_order_relaxed) & kDiscard) != 0; }

 private:
  using Gate = tbb::flow::limiter_node<Message, long long>;
  using Buffer = tbb::flow::queue_node<Message>;
  using Sequencer = tbb::flow::sequencer_node<Message>;
  using Worker = tbb::flow::function_node<Message, tbb::flow::continue_msg>;

  struct Consumer {
    std::size_t stage;
    std::size_t port;    // which of its inputs
    std::size_t output;  // which output of a router it takes (kAllOutputs: every item)
  };

  // A stage on a token edge: the tokens it holds, and the items that arrived without one, in
  // the order they came (they keep their producer's slot while they wait).
  struct TokenState {
    std::mutex mutex;
    std::size_t available = 1;
    std::deque<Message> parked;
  };

  // A join's collector: the parts of the items not yet complete, by sequence number.
  struct JoinState {
    std::mutex mutex;
    std::vector<std::uint64_t> arrived;      // [port]: sequence number it expects next
    std::deque<std::vector<Message>> parts;  // [seq - base][port]
    std::uint64_t base = 0;
  };

  // The flow graph proper; built inside the task arena so its tasks run there. Nodes are
  // declared after the graph so they are destroyed before it.
  struct Graph {
    tbb::flow::graph g;
    std::unique_ptr<tbb::flow::input_node<Message>> source;  // pulls the source (or the mix)
    std::unique_ptr<Worker> distribute;            // hands the source's items to its consumers
    std::vector<std::unique_ptr<Gate>> gates;      // [i]: stage i's output slots; none for sinks
    std::vector<std::unique_ptr<Buffer>> buffers;  // [i]: input of stage i; none for sources
    std::vector<std::unique_ptr<Worker>> workers;  // [i]: body of stage i; none for sources
    std::vector<std::vector<std::unique_ptr<Sequencer>>> ports;  // [join][port]
    std::vector<std::vector<std::unique_ptr<Worker>>> collectors;  // [join][port]
    std::vector<std::unique_ptr<JoinState>> joins;                 // [join]

    explicit Graph(Runtime& rt) {
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
  };

  // Which stages must receive their input in sequence order: those asked to, and every stage
  // upstream of one that must (or of a join, whose inputs always arrive in order), back to the
  // nearest FlatMap (which renumbers its outputs).
  std::vector<bool> ordered_inputs() const {
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

  std::vector<detail::StageGeometry> geometry() const {
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

  // The concurrency stage i can reach: its own, the threads, and its output slots.
  std::size_t workers(std::size_t i) const {
    return reachable_workers(nodes_[i].options.concurrency, threads_, out_capacity_[i]);
  }

  // Puts stage i's output on its edges: to the consumers of `output` (a router's choice) or of
  // every output; the others get a tombstone. Of those that get the value, each but the last
  // gets its own copy (made here, before any of them can touch it); the last the value itself.
  void push(std::size_t i, Message m, std::size_t output = kAllOutputs) {
    counters_[i]->emitted.fetch_add(1, std::memory_order_relaxed);
    const std::vector<Consumer>& to = consumers_[i];
    m.from = static_cast<std::uint32_t>(i);
    if (to.size() > 1) {
      m.sharers =
          std::make_shared<std::atomic<std::uint32_t>>(static_cast<std::uint32_t>(to.size()));
    }
    auto takes = [&](const Consumer& c) {
      return c.output == kAllOutputs || output == kAllOutputs || c.output == output;
    };
    std::size_t last = to.size();
    for (std::size_t k = 0; k < to.size(); ++k) last = takes(to[k]) ? k : last;
    for (std::size_t k = 0; k < to.size(); ++k) {
      Message out{m.seq, nullptr, m.from, m.sharers};
      if (k == last) {
        out.value = std::move(m.value);
      } else if (m.value && takes(to[k])) {
        out.value = detail::StageAccess::copy_input(*nodes_[to[k].stage].stage, m.value);
      }
      deliver(to[k], std::move(out));
    }
  }

  void deliver(const Consumer& c, Message m) {
    if (has_ports(nodes_[c.stage].shape.kind)) {
      graph_->ports[c.stage][c.port]->try_put(std::move(m));
    } else {
      graph_->buffers[c.stage]->try_put(std::move(m));
    }
  }

  // A consumer started `m`: the slot it held in its producer's output is free once every
  // consumer has.
  void release(const Message& m) {
    if (m.sharers && m.sharers->fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    graph_->gates[m.from]->decrementer().try_put(1);
  }

  // A part of join j's item arrived on `port` (in sequence order): when every port has
  // brought its part, the set goes to the join's buffer.
  void collect(std::size_t j, std::size_t port, Message& m) {
    JoinState& join = *graph_->joins[j];
    std::lock_guard lock(join.mutex);
    const std::size_t slot = static_cast<std::size_t>(m.seq - join.base);
    if (join.parts.size() <= slot) {
      join.parts.resize(slot + 1, std::vector<Message>(join.arrived.size()));
    }
    join.parts[slot][port] = std::move(m);
    join.arrived[port] = join.base + slot + 1;
    while (!join.parts.empty() &&
           *std::min_element(join.arrived.begin(), join.arrived.end()) > join.base) {
      auto set = std::make_shared<JoinedParts>(JoinedParts{std::move(join.parts.front())});
      join.parts.pop_front();
      graph_->buffers[j]->try_put(Message{join.base++, std::move(set)});
    }
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
      rt_.push(stage_, Message{rt_.next_seq_[stage_]++, std::move(value)});
    }
    bool stopped() const override { return rt_.stopped(); }
    void send_token() override { rt_.send_token(stage_); }

   private:
    Runtime& rt_;
    std::size_t stage_;
    bool holds_slot_;
  };

  Message produce(tbb::flow_control& fc) {
    if (halt_.load(std::memory_order_relaxed) != 0) {
      fc.stop();
      return {};
    }
    std::shared_ptr<void> value = mix_ ? next_mixed() : next_of(source_);
    if (!value) {
      fc.stop();
      return {};
    }
    counters_[source_]->items_out.fetch_add(1, std::memory_order_relaxed);
    return Message{next_seq_[source_]++, std::move(value)};
  }

  // The next item of source i, or nullptr when it is exhausted.
  std::shared_ptr<void> next_of(std::size_t i) {
    return invoke(i, next_seq_[i], [&] { return detail::StageAccess::next(*nodes_[i].stage); });
  }

  // The next item of the mix: from the input it picks for this item number; an exhausted input
  // drops out of the choice (or ends the mix, as it says).
  std::shared_ptr<void> next_mixed() {
    const std::vector<InputLink>& inputs = nodes_[source_].inputs;
    while (const std::optional<std::size_t> port = mix_->pick(next_seq_[source_], mix_alive_)) {
      const std::size_t s = inputs[*port].stage;
      if (std::shared_ptr<void> value = next_of(s)) {
        detail::StageAccess::mixed_at(*nodes_[s].stage, value, mix_->position(next_seq_[source_]));
        counters_[s]->items_out.fetch_add(1, std::memory_order_relaxed);
        ++next_seq_[s];
        return value;
      }
      mix_alive_[*port] = false;
    }
    return nullptr;
  }

  // Stage i waits for tokens: true if `m` may start now; else it is parked until a token comes.
  // Tombstones pass without one (no work, and no token will come back for them).
  bool take_token(std::size_t i, Message& m) {
    if (!tokens_[i] || !m.value || m.granted) return true;
    TokenState& t = *tokens_[i];
    std::lock_guard lock(t.mutex);
    if (t.available > 0 && t.parked.empty()) {
      --t.available;
      return true;
    }
    t.parked.push_back(std::move(m));
    return false;
  }

  // Stage `sender` hands a token to each stage waiting for its tokens.
  void send_token(std::size_t sender) {
    for (const std::size_t r : token_receivers_[sender]) grant(r);
  }

  // Stage `r` gets a token: its oldest parked item starts, or the token is kept for the next.
  void grant(std::size_t r) {
    TokenState& t = *tokens_[r];
    std::optional<Message> next;
    {
      std::lock_guard lock(t.mutex);
      if (t.parked.empty()) {
        ++t.available;
        return;
      }
      next = std::move(t.parked.front());
      t.parked.pop_front();
    }
    next->granted = true;
    graph_->workers[r]->try_put(std::move(*next));
  }

  // After the graph drained: an item still parked means its token never came back.
  void check_no_parked_items() {
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      if (!tokens_[i] || tokens_[i]->parked.empty()) continue;
      fail(StageError(nodes_[i].name, tokens_[i]->parked.front().seq,
                       "it waited for a token from '" + nodes_[i].options.token_from +
                           "' that never came (" + std::to_string(tokens_[i]->parked.size()) +
                           " item(s) left); that stage must call send_token() once per item "
                           "it lets through"));
    }
  }

  void handle(std::size_t i, Message& in) {
    // Paused by request_pause_discarding: an item not started becomes a tombstone without
    // taking a token (one it was granted goes to the next item waiting).
    const bool discard = in.value && may_discard_[i] && discarding();
    if (discard && in.granted) grant(i);
    if (!discard && !take_token(i, in)) return;
    detail::StageCounters& c = *counters_[i];
    c.started.fetch_add(1, std::memory_order_relaxed);
    Stage& stage = *nodes_[i].stage;
    const Kind kind = nodes_[i].shape.kind;

    std::vector<std::shared_ptr<void>> parts;  // a join's or merge's inputs
    if (has_ports(kind)) {
      JoinedParts& set = *static_cast<JoinedParts*>(in.value.get());
      std::size_t present = 0;
      for (Message& part : set.parts) {
        release(part);
        present += part.value ? 1 : 0;
        parts.push_back(std::move(part.value));
      }
      if (kind == Kind::kMerge && present > 1) {
        fail(StageError(nodes_[i].name, in.seq,
                        "it got the item from " + std::to_string(present) +
                            " of its inputs; a merge takes the branches of one router, which "
                            "sends each item down one"));
      }
      if (kind == Kind::kMerge && present == 1) {
        c.items_in.fetch_add(1, std::memory_order_relaxed);
        c.items_out.fetch_add(1, std::memory_order_relaxed);
        for (std::shared_ptr<void>& part : parts) {
          if (part) push(i, Message{in.seq, std::move(part)});
        }
        return;
      }
      if (present < parts.size()) in.value.reset();
    } else {
      release(in);
    }

    if (discard) {
      in.value.reset();
      parts.clear();
    }
    if (!in.value) {  // a tombstone: keep the sequence whole, do no work
      if (kind != Kind::kFlatMap && kind != Kind::kSink) push(i, Message{in.seq, nullptr});
      if (kind == Kind::kFlatMap) graph_->gates[i]->decrementer().try_put(1);
      return;
    }
    c.items_in.fetch_add(1, std::memory_order_relaxed);
    ItemContext ctx(in.seq);
    switch (kind) {
      case Kind::kMap:
      case Kind::kJoin: {
        std::shared_ptr<void> out = invoke(i, in.seq, [&] {
          return kind == Kind::kMap ? detail::StageAccess::map(stage, in.value, ctx)
                                    : detail::StageAccess::join(stage, parts, ctx);
        });
        in.value.reset();
        parts.clear();
        if (out) {
          c.items_out.fetch_add(1, std::memory_order_relaxed);
        } else {
          c.record_drop(in.seq, ctx.drop_reason().value_or("dropped by the stage"));
        }
        push(i, Message{in.seq, std::move(out)});
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
      case Kind::kRoute: {
        std::size_t output = 0;
        std::shared_ptr<void> out = invoke(i, in.seq, [&] {
          return detail::StageAccess::route(stage, in.value, ctx, output);
        });
        in.value.reset();
        if (out && output >= nodes_[i].shape.outputs.size()) {
          fail(StageError(nodes_[i].name, in.seq,
                          "routed the item to output " + std::to_string(output) + " of " +
                              std::to_string(nodes_[i].shape.outputs.size())));
        }
        if (out) {
          c.items_out.fetch_add(1, std::memory_order_relaxed);
        } else {
          c.record_drop(in.seq, ctx.drop_reason().value_or("dropped by the stage"));
        }
        push(i, Message{in.seq, std::move(out)}, out ? output : kAllOutputs);
        break;
      }
      case Kind::kSource:
      case Kind::kMerge:
      case Kind::kMix:
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

  void finish_sink(std::size_t i) {
    struct NoOutput final : EmitSink {
      void emit(std::shared_ptr<void>) override { throw Error("a sink cannot emit"); }
    } none;
    invoke(i, 0, [&] {
      detail::StageAccess::finish(*nodes_[i].stage, none);
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
      fail(StageError(nodes_[i].name, seq, what_of(std::current_exception())));
    }
  }

  // The run fails with `error`: it is kept as the run's error unless one came first, then every
  // stage lets invocations that wait for each other return (Stage::cancel), once, and the graph
  // drains. Kept before the stages are cancelled, so the error a run reports is the cause, never
  // a cancelled stage's reaction to it (which TBB may catch first).
  [[noreturn]] void fail(StageError error) {
    {
      std::lock_guard lock(first_error_mutex_);
      if (!first_error_) first_error_ = std::make_exception_ptr(error);
    }
    if (!cancelled_.exchange(true)) {
      for (const Node& node : nodes_) node.stage->cancel();
    }
    throw error;
  }

  RunReport make_report() {
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

  std::vector<Node>& nodes_;
  const std::vector<StageDecl> decls_;
  std::atomic<unsigned>& halt_;
  std::vector<std::unique_ptr<detail::StageCounters>>& counters_;
  std::vector<std::uint64_t>& next_seq_;
  std::optional<detail::DropLog>& drop_log_;
  const double earlier_wall_s_;
  const std::size_t source_;  // the stage the graph pulls: the source, or the mix
  const std::string key_prefix_;
  const std::size_t threads_;
  const std::size_t cores_;
  const detail::Clock::time_point start_;
  std::vector<std::vector<Consumer>> consumers_;  // [i]: the stages taking stage i's output
  std::vector<std::size_t> out_capacity_;         // [i]: its output slots (0: a sink)
  std::atomic<bool> cancelled_{false};  // the stages were cancelled (fail)
  std::mutex first_error_mutex_;
  std::exception_ptr first_error_;  // the first stage error of the run: the one it reports
  std::vector<std::unique_ptr<TokenState>> tokens_ =
      std::vector<std::unique_ptr<TokenState>>(nodes_.size());  // [i]: if it waits for tokens
  std::vector<std::vector<std::size_t>> token_receivers_ =
      std::vector<std::vector<std::size_t>>(nodes_.size());     // [sender]: who waits on it
  // [i]: whether a discarding pause may throw away its items (no stage before it waits for
  // tokens).
  std::vector<bool> may_discard_ = std::vector<bool>(nodes_.size(), true);
  // [i]: the number of the first item stage i receives in this run (its numbering stage's).
  std::vector<std::uint64_t> seq_base_ = std::vector<std::uint64_t>(nodes_.size(), 0);
  const MixStage* mix_ = nullptr;     // that mix, if any
  std::vector<bool> mix_alive_;       // [port]: that input of the mix is not exhausted yet
  std::optional<detail::TraceRecorder> trace_;
  std::optional<detail::Sampler> sampler_;
  Graph* graph_ = nullptr;
};

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
