#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "graph/item_type.hpp"

namespace flowtrain {

/// Concurrency values: how many invocations of a stage may run at once.
inline constexpr std::size_t kSerial = 1;
inline constexpr std::size_t kUnlimited = 0;

/// What a stage knows about the item it is processing, and how it drops one.
class ItemContext {
 public:
  explicit ItemContext(std::uint64_t seq) : seq_(seq) {}

  /// Sequence number of the item: its position in the source's output (or, after a FlatMap,
  /// in that stage's output). Unique per stage and independent of concurrency settings.
  std::uint64_t seq() const { return seq_; }

  /// Drops the current item: it is counted and listed with `reason` in the run report.
  ///   if (bytes.empty()) return ctx.drop("empty file " + path);
  std::nullopt_t drop(std::string reason) {
    drop_reason_ = std::move(reason);
    return std::nullopt;
  }
  const std::optional<std::string>& drop_reason() const { return drop_reason_; }

 private:
  std::uint64_t seq_;
  std::optional<std::string> drop_reason_;
};

/// Receives the outputs of a FlatMap; the runtime numbers them in the order they are emitted.
class EmitTarget {
 public:
  virtual void emit(std::shared_ptr<void> value) = 0;
  virtual bool stopped() const { return false; }
  virtual void send_token() {}

 protected:
  ~EmitTarget() = default;
};

/// Typed handle a FlatMap emits through:  `out.emit(Batch{...});`
template <class Out>
class Emitter {
 public:
  explicit Emitter(EmitTarget& sink) : sink_(sink) {}
  void emit(Out value) { sink_.emit(std::make_shared<Out>(std::move(value))); }
  /// True in `finish` when the run was stopped (Ctrl-C, SIGTERM, Pipeline::request_stop)
  /// rather than its input exhausted. A stage holding a partial group (a batch) then drops it:
  /// a resumed run rebuilds it whole from the source position of the last full one.
  bool stopped() const { return sink_.stopped(); }
  /// Hands one token back over a declared token edge: a stage upstream that names this one
  /// as its `token_from` may start its next item (an optimizer step lets the next forward
  /// begin on the weights it just wrote).
  void send_token() { sink_.send_token(); }

 private:
  EmitTarget& sink_;
};

/// The static shape of a stage, known before it is constructed (a registry entry has one too),
/// so configs are validated without building anything.
struct StageShape {
  enum class Kind { kSource, kMap, kFlatMap, kSink, kJoin, kRoute, kMerge, kMix };

  Kind kind = Kind::kMap;
  ItemType input;   // none for a source; the type of every input of a join
  ItemType output;  // none for a sink
  /// Largest allowed concurrency: kSerial for sources and flat maps, else kUnlimited.
  std::size_t max_concurrency = kUnlimited;
  /// The input type can be copied, so the stage can share a producer with other consumers
  /// (fan-out): each consumer but the last gets its own copy of the item's value.
  bool copyable_input = true;
  /// A router's named outputs (each item goes to one of them); empty for other stages.
  std::vector<std::string> outputs;

  /// How many inputs a stage of this kind takes: none for a source, one for a map, flat map,
  /// router or sink, two or more for a join, merge or mix.
  std::size_t min_inputs() const;
  std::size_t max_inputs() const;
};

const char* to_string(StageShape::Kind kind);

namespace detail {
struct StageAccess;
}

/// A named number a stage reports after its run (a loss, an accuracy, a step count).
struct StageResult {
  std::string name;
  double value = 0;
};

/// Time a stage's invocations spent waiting, not working, for a bounded resource of its own
/// that items further on hold (a batcher's pool of batch buffers), and the param that sets how
/// much of it there is. The verdict tells such a wait apart from work.
struct StageWait {
  double seconds = 0;  // summed over invocations
  std::string what;    // "a free batch buffer"
  std::string param;   // "pool_size"; empty: what takes its items outside the graph (a loop)
  double value = 0;    // the param's value
  /// What it waits for is held by the items after it (a pool's buffers), so lower queue
  /// capacities after it help too; false for a wait on its peers (a pipeline partition
  /// waiting for another's activations).
  bool held_after = true;
  /// `param` is its entry's: the node was brought by an entry (named "<entry>/<node>").
  bool entry_param = false;
};

/// Work a stage timed inside one of its items, on a track of its own: a pipeline partition's
/// forward of one micro-batch, say. The Chrome trace draws every span, the report a chart of
/// the last item's.
struct TimelineSpan {
  std::string track;       // "partition 0"
  std::string label;       // "F3"
  std::uint64_t item = 0;  // the stage's item it belongs to (a training step)
  /// Seconds: on std::chrono::steady_clock (its time_since_epoch) from Stage::timeline();
  /// since the run started in a StageReport.
  double begin_s = 0, end_s = 0;
};

/// Where a resumed run's source starts (Stage::resume_position): the place a checkpoint's run
/// had reached in its source.
struct ResumePosition {
  std::uint64_t items = 0;  // source items this process had consumed
  /// The same place in the order the data-parallel ranks share, where the source has one (a
  /// dataset source: epoch x dataset size + the items of that epoch the ranks took together).
  /// The same on every rank, and for any number of ranks; seek_shared starts there.
  std::optional<std::uint64_t> shared;
  /// The checkpoint was written by another number of ranks: `items` counts another share of
  /// the data, and only `shared` can say where to start.
  bool resized = false;
  bool operator==(const ResumePosition&) const = default;
};

/// Base of every stage. Derive from one of the typed bases below, never from this directly.
class Stage {
 public:
  virtual ~Stage() = default;
  virtual StageShape shape() const = 0;
  /// True if the stage needs its input in sequence order whatever the concurrency upstream
  /// (a batcher, for deterministic batches). The pipeline then delivers it in order.
  virtual bool requires_order() const { return false; }

  /// Threads one invocation keeps busy: 1, or more for a stage running intra-op parallel math.
  /// The pipeline checks that the busiest moment of the graph fits RunOptions::cores.
  virtual std::size_t threads_per_invocation() const { return 1; }
  /// True for a stage whose invocations run intra-op parallel math (a training or inference
  /// step): more intra-op threads, not more workers, speed a serial one up. The report's advice
  /// uses it.
  virtual bool intra_op_parallel() const { return false; }
  /// Between runs of a paused pipeline (autotune): use `threads` intra-op threads per
  /// invocation from now on. Returns false if the stage cannot: its count is fixed, or changes
  /// its results (any LibTorch forward may: OpenBLAS splits a matrix product's sums by its
  /// threads on some CPUs; see docs/training.md, "What changes the sums").
  virtual bool set_threads_per_invocation(std::size_t /*threads*/) { return false; }

  /// Called once before the run, in chain order, with the number of items the stage will
  /// probably receive (std::nullopt: unknown); returns how many it will probably emit. Sources
  /// return their total, maps pass the count on, a batcher divides it. A stage may keep the
  /// count (a learning-rate schedule needs the number of steps).
  virtual std::optional<std::uint64_t> plan(std::optional<std::uint64_t> /*inputs*/) {
    return std::nullopt;
  }

  /// A one-line problem with this stage taking items from `input` (a stage it takes them from
  /// directly), else an empty string: a check between two built stages that the graph cannot
  /// make, since it knows no concrete stage (a teacher_infer behind a teacher_cache that names
  /// another teacher). Pipeline::check and run refuse the graph with it, before any item.
  virtual std::string input_problem(const Stage& /*input*/) const { return {}; }

  /// The source position this stage asks the run to start from: where the source stood when
  /// a restored checkpoint was taken. The pipeline seeks its source there before the run.
  virtual std::optional<ResumePosition> resume_position() const { return std::nullopt; }

  /// Sources that can resume: skip the first `position` items of the run. False if unsupported.
  virtual bool seek(std::uint64_t /*position*/) { return false; }

  /// Sources whose order data-parallel ranks share: start at `position` of that order
  /// (ResumePosition::shared), this run's ranks dividing the rest between them. False if
  /// unsupported or past the end.
  virtual bool seek_shared(std::uint64_t /*position*/) { return false; }

  /// What the stage reports after the run, in display order (printed under the stage table).
  virtual std::vector<StageResult> results() const { return {}; }
  /// What its invocations waited for, after the run (StageWait); nothing by default.
  virtual StageWait waiting() const { return {}; }
  /// A few numbers shown on the live progress line while the run lasts (step, epoch, loss...).
  /// Called from the pipeline's sampler thread while the stage runs: must be thread-safe.
  virtual std::vector<StageResult> live_results() const { return {}; }
  /// What the stage timed inside its items, after the run (see TimelineSpan).
  virtual std::vector<TimelineSpan> timeline() const { return {}; }

  /// The run is failing (another stage threw): a stage whose invocations wait for each other
  /// (pipeline partitions, whose tasks suspend until a peer hands them a tensor) makes them
  /// return, since a peer's invocation may now never start. Called once, from the failing
  /// thread, while invocations may run; must not throw.
  virtual void cancel() {}

 private:
  friend struct detail::StageAccess;
  // Type-erased entry points, implemented by the typed bases. `value` holds the input type the
  // shape declares; the runtime checked that before the run.
  virtual std::shared_ptr<void> next_erased() { return nullptr; }
  virtual void mixed_at_erased(std::shared_ptr<void>& /*value*/, std::uint64_t /*position*/) {}
  virtual std::shared_ptr<void> map_erased(std::shared_ptr<void>& /*value*/, ItemContext&) {
    return nullptr;
  }
  virtual void flat_map_erased(std::shared_ptr<void>& /*value*/, EmitTarget&) {}
  virtual void finish_erased(EmitTarget&) {}
  virtual void consume_erased(std::shared_ptr<void>& /*value*/, ItemContext&) {}
  virtual std::shared_ptr<void> join_erased(std::vector<std::shared_ptr<void>>& /*parts*/,
                                            ItemContext&) {
    return nullptr;
  }
  virtual std::shared_ptr<void> route_erased(std::shared_ptr<void>& /*value*/,
                                             ItemContext&,
                                             std::size_t& /*output*/) {
    return nullptr;
  }
  // A copy of an input value, for the consumers of a fan-out (shape().copyable_input).
  virtual std::shared_ptr<void> copy_input_erased(const std::shared_ptr<void>& value) const {
    return value;
  }
};

namespace detail {
// The copy a consumer of a fan-out gets: a new value copy-constructed from the shared one.
// Types holding tensors or cv::Mat copy their handles, not the data behind them.
template <class In>
std::shared_ptr<void> copy_value(const std::shared_ptr<void>& value) {
  if constexpr (std::is_copy_constructible_v<In>) {
    return std::make_shared<In>(*static_cast<const In*>(value.get()));
  } else {
    return nullptr;  // never called: the pipeline refuses to fan out to this stage
  }
}

template <class In>
StageShape shape_of(StageShape::Kind kind, ItemType output, std::size_t max_concurrency) {
  return {kind, ItemType::of<In>(), output, max_concurrency, std::is_copy_constructible_v<In>};
}
}  // namespace detail

/// Produces items until exhausted (returns std::nullopt) or the run is stopped. Serial.
///
///   class Count final : public Source<int> {
///     std::optional<int> next() override { return i_ < 10 ? std::optional(i_++) : std::nullopt; }
///     int i_ = 0;
///   };
template <class Out>
class Source : public Stage {
 public:
  using output_type = Out;
  static StageShape static_shape() {
    return {StageShape::Kind::kSource, {}, ItemType::of<Out>(), kSerial};
  }
  StageShape shape() const override { return static_shape(); }

 protected:
  virtual std::optional<Out> next() = 0;
  /// Behind a mix, the item next() just gave is item `position` of the mix's order, where a run
  /// resumed after it starts the mix (MixStage::seek). A source whose items say where to resume
  /// (a Sample's position) takes that from here; nothing by default.
  virtual void mixed_at(Out& /*item*/, std::uint64_t /*position*/) {}

 private:
  std::shared_ptr<void> next_erased() final {
    std::optional<Out> out = next();
    return out ? std::make_shared<Out>(std::move(*out)) : nullptr;
  }
  void mixed_at_erased(std::shared_ptr<void>& value, std::uint64_t position) final {
    mixed_at(*static_cast<Out*>(value.get()), position);
  }
};

/// One item in, at most one out. Any concurrency; `process` must then be thread-safe.
/// Return std::nullopt (best through `ctx.drop(reason)`) to drop the item.
template <class In, class Out>
class Map : public Stage {
 public:
  using input_type = In;
  using output_type = Out;
  static StageShape static_shape() {
    return detail::shape_of<In>(StageShape::Kind::kMap, ItemType::of<Out>(), kUnlimited);
  }
  StageShape shape() const override { return static_shape(); }
  /// A map emits what it receives, unless it drops some.
  std::optional<std::uint64_t> plan(std::optional<std::uint64_t> inputs) override {
    return inputs;
  }

 protected:
  virtual std::optional<Out> process(In&& in, ItemContext& ctx) = 0;

 private:
  std::shared_ptr<void> map_erased(std::shared_ptr<void>& value, ItemContext& ctx) final {
    std::optional<Out> out = process(std::move(*static_cast<In*>(value.get())), ctx);
    return out ? std::make_shared<Out>(std::move(*out)) : nullptr;
  }
  std::shared_ptr<void> copy_input_erased(const std::shared_ptr<void>& value) const final {
    return detail::copy_value<In>(value);
  }
};

/// Any number of items out per item in (batching, splitting), plus a final `finish` once the
/// input is exhausted. Serial; outputs get fresh sequence numbers in the order emitted.
template <class In, class Out>
class FlatMap : public Stage {
 public:
  using input_type = In;
  using output_type = Out;
  static StageShape static_shape() {
    return detail::shape_of<In>(StageShape::Kind::kFlatMap, ItemType::of<Out>(), kSerial);
  }
  StageShape shape() const override { return static_shape(); }

 protected:
  virtual void process(In&& in, Emitter<Out>& out) = 0;
  virtual void finish(Emitter<Out>& /*out*/) {}

 private:
  void flat_map_erased(std::shared_ptr<void>& value, EmitTarget& sink) final {
    Emitter<Out> out(sink);
    process(std::move(*static_cast<In*>(value.get())), out);
  }
  void finish_erased(EmitTarget& sink) final {
    Emitter<Out> out(sink);
    finish(out);
  }
  std::shared_ptr<void> copy_input_erased(const std::shared_ptr<void>& value) const final {
    return detail::copy_value<In>(value);
  }
};

/// Consumes items: the end of a pipeline. Any concurrency. `Sink<Anything>` takes every type.
template <class In>
class Sink : public Stage {
 public:
  using input_type = In;
  static StageShape static_shape() {
    return detail::shape_of<In>(StageShape::Kind::kSink, {}, kUnlimited);
  }
  StageShape shape() const override { return static_shape(); }

 protected:
  virtual void consume(In&& in, ItemContext& ctx) = 0;
  /// Called once after the last item, unless the run failed (also after a requested stop).
  virtual void finish() {}

 private:
  void finish_erased(EmitTarget&) final { finish(); }
  void consume_erased(std::shared_ptr<void>& value, ItemContext& ctx) final {
    if constexpr (std::is_same_v<In, Anything>) {
      consume(Anything{}, ctx);
    } else {
      consume(std::move(*static_cast<In*>(value.get())), ctx);
    }
  }
  std::shared_ptr<void> copy_input_erased(const std::shared_ptr<void>& value) const final {
    if constexpr (std::is_same_v<In, Anything>) return value;  // never looked at: share it
    return detail::copy_value<In>(value);
  }
};

/// A sink that takes one item at a time, in sequence order: for stages whose result depends on
/// the order (a training step, an evaluation that must sum the same way every run).
template <class In>
class SerialSink : public Sink<In> {
 public:
  static StageShape static_shape() {
    StageShape shape = Sink<In>::static_shape();
    shape.max_concurrency = kSerial;
    return shape;
  }
  StageShape shape() const override { return static_shape(); }
  bool requires_order() const override { return true; }
};

/// Combines the items with the same sequence number from each of its inputs (two or more, all
/// of type `In`, in the order the stage lists them) into one: a two-teacher ensemble, or any
/// stage that needs several views of one item. Its inputs must be numbered by the same source
/// or flat map. If any input dropped the item, the join drops it too (no call). Any
/// concurrency; `process` must then be thread-safe.
///
///   class Mean final : public Join<float, float> {
///     std::optional<float> process(std::vector<float>&& parts, ItemContext&) override {
///       return std::accumulate(parts.begin(), parts.end(), 0.0f) / parts.size();
///     }
///   };
///   pipeline.add("mean", std::make_unique<Mean>(), {.inputs = {"teacher_a", "teacher_b"}});
template <class In, class Out>
class Join : public Stage {
 public:
  using input_type = In;
  using output_type = Out;
  static StageShape static_shape() {
    return detail::shape_of<In>(StageShape::Kind::kJoin, ItemType::of<Out>(), kUnlimited);
  }
  StageShape shape() const override { return static_shape(); }
  std::optional<std::uint64_t> plan(std::optional<std::uint64_t> inputs) override {
    return inputs;
  }

 protected:
  virtual std::optional<Out> process(std::vector<In>&& parts, ItemContext& ctx) = 0;

 private:
  std::shared_ptr<void> join_erased(std::vector<std::shared_ptr<void>>& values,
                                    ItemContext& ctx) final {
    std::vector<In> parts;
    parts.reserve(values.size());
    for (std::shared_ptr<void>& v : values) parts.push_back(std::move(*static_cast<In*>(v.get())));
    std::optional<Out> out = process(std::move(parts), ctx);
    return out ? std::make_shared<Out>(std::move(*out)) : nullptr;
  }
  std::shared_ptr<void> copy_input_erased(const std::shared_ptr<void>& value) const final {
    return detail::copy_value<In>(value);
  }
};

/// What a Router returns: which of its outputs the item goes to (an index into the names its
/// shape declares), and the item.
template <class Out>
struct Routed {
  std::size_t output = 0;
  Out value;
};

/// Sends each item to one of its named outputs. The stages that take another of its outputs get
/// a tombstone in its place, so they do no work for it and their sequence stays whole; a `merge`
/// downstream takes each item back from the branch it went through, in sequence order. Consumers
/// name an output as `stage.output`. Any concurrency; `process` must then be thread-safe. The
/// class declares its outputs in its shape:
///
///   class Parity final : public Router<std::uint64_t, std::uint64_t> {
///    public:
///     static StageShape static_shape() { return shape_with_outputs({"even", "odd"}); }
///     StageShape shape() const override { return static_shape(); }
///
///    protected:
///     std::optional<Routed<std::uint64_t>> process(std::uint64_t&& n, ItemContext&) override {
///       return Routed<std::uint64_t>{n % 2, n};
///     }
///   };
///   // stages: parity, then {slow, inputs: parity.odd}, then {merge, inputs: [parity.even, slow]}
template <class In, class Out>
class Router : public Stage {
 public:
  using input_type = In;
  using output_type = Out;
  static StageShape shape_with_outputs(std::vector<std::string> outputs) {
    StageShape shape =
        detail::shape_of<In>(StageShape::Kind::kRoute, ItemType::of<Out>(), kUnlimited);
    shape.outputs = std::move(outputs);
    return shape;
  }
  std::optional<std::uint64_t> plan(std::optional<std::uint64_t> inputs) override {
    return inputs;
  }

 protected:
  virtual std::optional<Routed<Out>> process(In&& in, ItemContext& ctx) = 0;

 private:
  std::shared_ptr<void> route_erased(std::shared_ptr<void>& value,
                                     ItemContext& ctx,
                                     std::size_t& output) final {
    std::optional<Routed<Out>> out = process(std::move(*static_cast<In*>(value.get())), ctx);
    if (!out) return nullptr;
    output = out->output;
    return std::make_shared<Out>(std::move(out->value));
  }
  std::shared_ptr<void> copy_input_erased(const std::shared_ptr<void>& value) const final {
    return detail::copy_value<In>(value);
  }
};

/// Built in as stage type `merge`: two or more inputs, the branches of one router; for each
/// sequence number it emits the one item that came through any of them (the others bring
/// tombstones), in sequence order. Its output type is its inputs'. No code of its own runs.
class MergeStage final : public Stage {
 public:
  static StageShape static_shape() {
    return {StageShape::Kind::kMerge, ItemType::of<Anything>(), ItemType::of<SameAsInputs>(),
            kUnlimited};
  }
  StageShape shape() const override { return static_shape(); }
  std::optional<std::uint64_t> plan(std::optional<std::uint64_t> inputs) override {
    return inputs;
  }
};

}  // namespace flowtrain
