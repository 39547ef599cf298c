#pragma once

// Small stages for the graph tests: they record what the framework did to them.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "graph/registry.hpp"
#include "graph/stage.hpp"

namespace flowtrain::testing {

/// Highest value a counter reached, updated lock-free.
inline void raise_max(std::atomic<std::int64_t>& max, std::int64_t value) {
  std::int64_t seen = max.load();
  while (value > seen && !max.compare_exchange_weak(seen, value)) {
  }
}

inline void sleep_us(std::int64_t us) {
  std::this_thread::sleep_for(std::chrono::microseconds(us));
}

/// A value that counts how many of its kind are alive, to show memory stays flat.
struct Tracked {
  static inline std::atomic<std::int64_t> live{0};
  static inline std::atomic<std::int64_t> peak{0};
  std::uint64_t value = 0;

  explicit Tracked(std::uint64_t v = 0) : value(v) { born(); }
  Tracked(const Tracked& other) : value(other.value) { born(); }
  Tracked(Tracked&& other) noexcept : value(other.value) { born(); }
  Tracked& operator=(const Tracked&) = default;
  Tracked& operator=(Tracked&&) = default;
  ~Tracked() { live.fetch_sub(1); }

 private:
  static void born() { raise_max(peak, live.fetch_add(1) + 1); }
};

/// Emits 0 .. count-1 (forever if count < 0), calling `on_next` before each.
template <class T = std::uint64_t>
class CountSource final : public Source<T> {
 public:
  explicit CountSource(std::int64_t count, std::function<void(std::uint64_t)> on_next = {})
      : count_(count), on_next_(std::move(on_next)) {}

 protected:
  std::optional<T> next() override {
    if (count_ >= 0 && next_ >= static_cast<std::uint64_t>(count_)) return std::nullopt;
    if (on_next_) on_next_(next_);
    return T(next_++);
  }

 private:
  std::int64_t count_;
  std::uint64_t next_ = 0;
  std::function<void(std::uint64_t)> on_next_;
};

/// A Map that runs `body` (which may sleep, throw or drop) and tracks its own concurrency.
template <class In = std::uint64_t, class Out = In>
class ProbeMap final : public Map<In, Out> {
 public:
  using Body = std::function<std::optional<Out>(In&&, ItemContext&)>;
  explicit ProbeMap(Body body) : body_(std::move(body)) {}
  std::atomic<std::int64_t> active{0};
  std::atomic<std::int64_t> peak{0};

 protected:
  std::optional<Out> process(In&& in, ItemContext& ctx) override {
    raise_max(peak, active.fetch_add(1) + 1);
    struct Leave {
      std::atomic<std::int64_t>& a;
      ~Leave() { a.fetch_sub(1); }
    } leave{active};
    return body_(std::move(in), ctx);
  }

 private:
  Body body_;
};

/// A sink that runs `body` on each item.
template <class In = std::uint64_t>
class ProbeSink final : public Sink<In> {
 public:
  using Body = std::function<void(In&&, ItemContext&)>;
  explicit ProbeSink(Body body) : body_(std::move(body)) {}

 protected:
  void consume(In&& in, ItemContext& ctx) override { body_(std::move(in), ctx); }

 private:
  Body body_;
};

/// Registers a ProbeSink<In> running `body` as stage type `type` in `registry`, for YAML
/// configs in tests:  add_probe_sink<Batch>(registry, "sink", [&](Batch&& b, ItemContext&) {...});
template <class In>
void add_probe_sink(Registry& registry,
                    const std::string& type,
                    std::function<void(In&&, ItemContext&)> body) {
  registry.add({type, {"a test's probe", {}}, Sink<In>::static_shape(), [body](const Params&, const BuildContext&) {
                  return std::unique_ptr<Stage>(new ProbeSink<In>(body));
                }});
}

/// Records the sequence numbers and values it receives, in arrival order.
class RecordSink final : public Sink<std::uint64_t> {
 public:
  std::mutex mutex;
  std::vector<std::uint64_t> seqs;
  std::vector<std::uint64_t> values;

 protected:
  void consume(std::uint64_t&& value, ItemContext& ctx) override {
    std::lock_guard lock(mutex);
    seqs.push_back(ctx.seq());
    values.push_back(value);
  }
};

}  // namespace flowtrain::testing
