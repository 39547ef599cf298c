#pragma once

// Internal to graph/: one run of a Pipeline as a oneTBB flow graph. runtime.cpp is an item's
// way through it (gates, buffers, joins, tokens, the stage calls); runtime_setup.cpp builds
// the graph, runs it and reports the run.

#include <oneapi/tbb/flow_graph.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "graph/metrics.hpp"
#include "graph/mix.hpp"
#include "graph/pipeline.hpp"
#include "graph/trace.hpp"

namespace flowtrain {

namespace detail {

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

}  // namespace detail

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
  Runtime(Pipeline& pipeline, const RunOptions& options);

  RunReport run(const RunOptions& options);

  // Stopped early on request (request_stop: SIGINT, SIGTERM).
  bool stopped() const { return (halt_.load(std::memory_order_relaxed) & kStopped) != 0; }
  // Paused (Pipeline::request_pause) rather than stopped or run to its end.
  bool paused() const {
    return (halt_.load(std::memory_order_relaxed) & ~kDiscard) == kPaused;
  }
  // Paused by request_pause_discarding: items not yet started are thrown away.
  bool discarding() const { return (halt_.load(std::memory_order_relaxed) & kDiscard) != 0; }

 private:
  using Kind = StageShape::Kind;

  using Message = detail::Message;
  using JoinedParts = detail::JoinedParts;

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

    explicit Graph(Runtime& rt);
  };

  // Which stages must receive their input in sequence order: those asked to, and every stage
  // upstream of one that must (or of a join, whose inputs always arrive in order), back to the
  // nearest FlatMap (which renumbers its outputs).
  std::vector<bool> ordered_inputs() const;

  std::vector<detail::StageGeometry> geometry() const;

  // The concurrency stage i can reach: its own, the threads, and its output slots.
  std::size_t workers(std::size_t i) const;

  // Puts stage i's output on its edges: to the consumers of `output` (a router's choice) or of
  // every output; the others get a tombstone. Of those that get the value, each but the last
  // gets its own copy (made here, before any of them can touch it); the last the value itself.
  void push(std::size_t i, Message m, std::size_t output = kAllOutputs);

  void deliver(const Consumer& c, Message m);

  // A consumer started `m`: the slot it held in its producer's output is free once every
  // consumer has.
  void release(const Message& m);

  // A part of join j's item arrived on `port` (in sequence order): when every port has
  // brought its part, the set goes to the join's buffer.
  void collect(std::size_t j, std::size_t port, Message& m);

  // Outputs of a FlatMap: fresh sequence numbers, and one output slot each. The item that was
  // admitted holds one slot; each further output takes another (and no output frees it).
  class FlatEmit;

  Message produce(tbb::flow_control& fc);

  // The next item of source i, or nullptr when it is exhausted.
  std::shared_ptr<void> next_of(std::size_t i);

  // The next item of the mix: from the input it picks for this item number; an exhausted input
  // drops out of the choice (or ends the mix, as it says).
  std::shared_ptr<void> next_mixed();

  // Stage i waits for tokens: true if `m` may start now; else it is parked until a token comes.
  // Tombstones pass without one (no work, and no token will come back for them).
  bool take_token(std::size_t i, Message& m);

  // Stage `sender` hands a token to each stage waiting for its tokens.
  void send_token(std::size_t sender);

  // Stage `r` gets a token: its oldest parked item starts, or the token is kept for the next.
  void grant(std::size_t r);

  // After the graph drained: an item still parked means its token never came back.
  void check_no_parked_items();

  void handle(std::size_t i, Message& in);

  void finish(std::size_t i);

  void finish_sink(std::size_t i);

  // Runs stage code with timing, concurrency tracking and error context.
  template <class F>
  std::invoke_result_t<F&> invoke(std::size_t i, std::uint64_t seq, F&& body);

  // The run fails with `error`: it is kept as the run's error unless one came first, then every
  // stage lets invocations that wait for each other return (Stage::cancel), once, and the graph
  // drains. Kept before the stages are cancelled, so the error a run reports is the cause, never
  // a cancelled stage's reaction to it (which TBB may catch first).
  [[noreturn]] void fail(StageError error);

  RunReport make_report();

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

}  // namespace flowtrain
