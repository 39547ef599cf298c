// An item's way through a run's flow graph (graph/runtime.hpp): gates, buffers, joins, tokens,
// and the calls into the stages.

#include <algorithm>

#include "graph/checks.hpp"
#include "graph/error.hpp"
#include "graph/runtime.hpp"

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
  static void flat_map(Stage& s, std::shared_ptr<void>& v, EmitTarget& out) {
    s.flat_map_erased(v, out);
  }
  static void finish(Stage& s, EmitTarget& out) { s.finish_erased(out); }
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

using detail::has_ports;

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

template <class F>
std::invoke_result_t<F&> Pipeline::Runtime::invoke(std::size_t i, std::uint64_t seq, F&& body) {
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

void Pipeline::Runtime::push(std::size_t i, Message m, std::size_t output) {
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

void Pipeline::Runtime::deliver(const Consumer& c, Message m) {
  if (has_ports(nodes_[c.stage].shape.kind)) {
    graph_->ports[c.stage][c.port]->try_put(std::move(m));
  } else {
    graph_->buffers[c.stage]->try_put(std::move(m));
  }
}

void Pipeline::Runtime::release(const Message& m) {
  if (m.sharers && m.sharers->fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  graph_->gates[m.from]->decrementer().try_put(1);
}

void Pipeline::Runtime::collect(std::size_t j, std::size_t port, Message& m) {
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
class Pipeline::Runtime::FlatEmit final : public EmitTarget {
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

Pipeline::Runtime::Message Pipeline::Runtime::produce(tbb::flow_control& fc) {
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

std::shared_ptr<void> Pipeline::Runtime::next_of(std::size_t i) {
  return invoke(i, next_seq_[i], [&] { return detail::StageAccess::next(*nodes_[i].stage); });
}

std::shared_ptr<void> Pipeline::Runtime::next_mixed() {
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

bool Pipeline::Runtime::take_token(std::size_t i, Message& m) {
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

void Pipeline::Runtime::send_token(std::size_t sender) {
  for (const std::size_t r : token_receivers_[sender]) grant(r);
}

void Pipeline::Runtime::grant(std::size_t r) {
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

void Pipeline::Runtime::check_no_parked_items() {
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    if (!tokens_[i] || tokens_[i]->parked.empty()) continue;
    fail(StageError(nodes_[i].name, tokens_[i]->parked.front().seq,
                     "it waited for a token from '" + nodes_[i].options.token_from +
                         "' that never came (" + std::to_string(tokens_[i]->parked.size()) +
                         " item(s) left); that stage must call send_token() once per item "
                         "it lets through"));
  }
}

void Pipeline::Runtime::handle(std::size_t i, Message& in) {
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

void Pipeline::Runtime::finish(std::size_t i) {
  FlatEmit emit(*this, i, /*holds_slot=*/false);
  invoke(i, next_seq_[i], [&] {
    detail::StageAccess::finish(*nodes_[i].stage, emit);
    return 0;
  });
}

void Pipeline::Runtime::finish_sink(std::size_t i) {
  struct NoOutput final : EmitTarget {
    void emit(std::shared_ptr<void>) override { throw Error("a sink cannot emit"); }
  } none;
  invoke(i, 0, [&] {
    detail::StageAccess::finish(*nodes_[i].stage, none);
    return 0;
  });
}

[[noreturn]] void Pipeline::Runtime::fail(StageError error) {
  {
    std::lock_guard lock(first_error_mutex_);
    if (!first_error_) first_error_ = std::make_exception_ptr(error);
  }
  if (!cancelled_.exchange(true)) {
    for (const Node& node : nodes_) node.stage->cancel();
  }
  throw error;
}

}  // namespace flowtrain
