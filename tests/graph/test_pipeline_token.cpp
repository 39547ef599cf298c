// Token edges: a stage that starts an item only when a stage downstream hands a token back (the
// training loop's forward t+1 waits for update t), and their checks.

#include <doctest/doctest.h>

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "graph/config.hpp"
#include "graph/error.hpp"
#include "graph/pipeline.hpp"
#include "tests/test_stages.hpp"

using namespace flowtrain;
using namespace flowtrain::testing;

namespace {

// The weights version the "optimizer" has reached, and what the "forward" saw.
struct Loop {
  std::atomic<std::uint64_t> version{0};
  std::atomic<std::uint64_t> forwards{0};
  std::atomic<std::uint64_t> stale{0};  // forwards that started before the previous update
  std::function<void(std::uint64_t)> after_update;  // of this item, before its token goes back
};

struct Part {
  std::uint64_t item = 0;
  std::uint64_t index = 0;
  std::uint64_t count = 0;
};

// Like train_step: for each item, checks it runs on the version the previous items left, then
// emits `parts` parts (gradient buckets).
class Forward final : public FlatMap<std::uint64_t, Part> {
 public:
  Forward(Loop& loop, std::uint64_t parts) : loop_(loop), parts_(parts) {}
  bool requires_order() const override { return true; }

 protected:
  void process(std::uint64_t&& item, Emitter<Part>& out) override {
    if (loop_.version.load() != loop_.forwards.load()) ++loop_.stale;
    ++loop_.forwards;
    sleep_us(static_cast<std::int64_t>(item * 37 % 200));
    for (std::uint64_t k = 0; k < parts_; ++k) out.emit(Part{item, k, parts_});
  }

 private:
  Loop& loop_;
  std::uint64_t parts_;
};

// Like optimizer_step: once it has every part of an item, updates and sends the token back
// (unless `withhold`, to show the run then fails instead of hanging).
class Apply final : public FlatMap<Part, std::uint64_t> {
 public:
  explicit Apply(Loop& loop, bool withhold = false) : loop_(loop), withhold_(withhold) {}

 protected:
  void process(Part&& part, Emitter<std::uint64_t>& out) override {
    CHECK(part.index == seen_);  // parts come in order
    if (++seen_ < part.count) return;
    seen_ = 0;
    sleep_us(100);
    ++loop_.version;
    if (loop_.after_update) loop_.after_update(part.item);
    out.emit(part.item);
    if (!withhold_) out.send_token();
  }

 private:
  Loop& loop_;
  bool withhold_;
  std::uint64_t seen_ = 0;
};

std::unique_ptr<Stage> null_sink_for_tokens() {
  return std::make_unique<ProbeSink<>>([](std::uint64_t&&, ItemContext&) {});
}

std::unique_ptr<Stage> slow_copy() {
  return std::make_unique<ProbeMap<Part>>([](Part&& p, ItemContext&) -> std::optional<Part> {
    sleep_us(static_cast<std::int64_t>((p.item * 13 + p.index * 71) % 150));
    return p;
  });
}

}  // namespace

TEST_CASE("Pipeline.Token.NextItemWaitsForTheUpdate" * doctest::timeout(120)) {
  // Whatever the threads, capacities and concurrency of the middle stage, each forward starts
  // on the version the previous update wrote, and every item comes through once, in order.
  for (const std::size_t threads : {1, 2, 4}) {
    for (const std::size_t capacity : {1, 2, 8}) {
      for (const std::uint64_t parts : {1, 3}) {
        CAPTURE(threads);
        CAPTURE(capacity);
        CAPTURE(parts);
        Loop loop;
        auto* sink = new RecordSink;
        Pipeline p;
        p.add("numbers", std::make_unique<CountSource<>>(40))
            .add("forward", std::make_unique<Forward>(loop, parts),
                 {.queue_capacity = capacity, .token_from = "apply"})
            .add("sync", slow_copy(), {.concurrency = 3, .queue_capacity = capacity})
            .add("apply", std::make_unique<Apply>(loop),
                 {.queue_capacity = std::max<std::size_t>(capacity, 3), .ordered = true})
            .add("sink", std::unique_ptr<Stage>(sink), {.ordered = true});
        const RunReport report = p.run({.threads = threads});
        CHECK(loop.stale.load() == 0);
        CHECK(loop.version.load() == 40);
        REQUIRE(sink->values.size() == 40);
        for (std::uint64_t i = 0; i < 40; ++i) CHECK(sink->values[i] == i);
        CHECK(report.stages[1].items_in == 40);
      }
    }
  }
}

TEST_CASE("Pipeline.Token.DroppedItemsPassWithoutAToken" * doctest::timeout(60)) {
  // Items dropped before the waiting stage reach it as tombstones: they take no token (none
  // would come back for them), so the run neither stalls nor lets a forward run early.
  for (const std::size_t threads : {1, 2}) {
    CAPTURE(threads);
    Loop loop;
    auto* sink = new RecordSink;
    Pipeline p;
    p.add("numbers", std::make_unique<CountSource<>>(30))
        .add("filter",
             std::make_unique<ProbeMap<>>(
                 [](std::uint64_t&& v, ItemContext& ctx) -> std::optional<std::uint64_t> {
                   if (v % 4 == 1) return ctx.drop("odd one");
                   return v;
                 }),
             {.concurrency = 2})
        .add("forward", std::make_unique<Forward>(loop, 2), {.token_from = "apply"})
        .add("apply", std::make_unique<Apply>(loop), {.ordered = true})
        .add("sink", std::unique_ptr<Stage>(sink), {.ordered = true});
    const RunReport report = p.run({.threads = threads});
    CHECK(loop.stale.load() == 0);
    CHECK(loop.forwards.load() == 30 - 8);
    CHECK(sink->values.size() == 30 - 8);
    CHECK(report.stages[1].dropped == 8);
  }
}

TEST_CASE("Pipeline.Token.DiscardingPauseReturnsEveryToken" * doctest::timeout(60)) {
  // A pause that throws the work in flight away (autotune's rehearsals), asked for by `apply`
  // as it updates item 10: the items parked at `forward` for a token, or queued before it,
  // never start (the token each is granted passes to the next); what is past `forward`
  // finishes. The next run goes on after the last item produced, every token back.
  for (const std::size_t threads : {1, 2}) {
    CAPTURE(threads);
    Loop loop;
    auto* sink = new RecordSink;
    Pipeline p;
    loop.after_update = [&p](std::uint64_t item) {
      if (item == 10) p.request_pause_discarding();
    };
    p.add("numbers", std::make_unique<CountSource<>>(300))
        .add("prep", std::make_unique<ProbeMap<>>([](std::uint64_t&& v, ItemContext&) {
               return std::optional<std::uint64_t>(v);
             }),
             {.queue_capacity = 64})
        .add("forward", std::make_unique<Forward>(loop, 2),
             {.queue_capacity = 64, .token_from = "apply"})
        .add("sync", slow_copy(), {.concurrency = 2, .queue_capacity = 4})
        .add("apply", std::make_unique<Apply>(loop), {.queue_capacity = 4, .ordered = true})
        .add("sink", std::unique_ptr<Stage>(sink), {.ordered = true});
    const RunReport first = p.run({.threads = threads});
    REQUIRE(first.paused);
    const std::uint64_t produced = p.produced();
    CHECK(produced > 11);
    CHECK(loop.forwards.load() == 11);  // forward 11 waited for update 10's token
    CHECK(loop.version.load() == 11);
    REQUIRE(sink->values.size() == 11);
    for (std::uint64_t k = 0; k < 11; ++k) CHECK(sink->values[k] == k);

    const RunReport rest = p.run({.threads = threads});
    CHECK_FALSE(rest.paused);
    CHECK(loop.stale.load() == 0);
    REQUIRE(sink->values.size() == 11 + (300 - produced));
    for (std::uint64_t v = produced; v < 300; ++v) CHECK(sink->values[11 + v - produced] == v);
    CHECK(rest.stages[2].dropped == 0);  // thrown away is not dropped
  }
}

TEST_CASE("Pipeline.Token.MissingTokenFailsNamingBothStages" * doctest::timeout(60)) {
  Loop loop;
  Pipeline p;
  p.add("numbers", std::make_unique<CountSource<>>(5))
      .add("forward", std::make_unique<Forward>(loop, 1), {.token_from = "apply"})
      .add("apply", std::make_unique<Apply>(loop, /*withhold=*/true))
      .add("sink", null_sink_for_tokens());
  CHECK_THROWS_WITH(p.run({.threads = 2}),
                    doctest::Contains("stage 'forward' failed on item 1: it waited for a token "
                                      "from 'apply' that never came (4 item(s) left)"));
  CHECK(loop.forwards.load() == 1);
}

TEST_CASE("Pipeline.Token.EdgeChecks" * doctest::timeout(60)) {
  Loop loop;
  auto build = [&](std::string token_from, bool apply_is_map = false) {
    auto p = std::make_unique<Pipeline>();
    p->add("numbers", std::make_unique<CountSource<>>(5))
        .add("forward", std::make_unique<Forward>(loop, 1), {.token_from = std::move(token_from)});
    if (apply_is_map) {
      p->add("apply", slow_copy())
          .add("sink", std::make_unique<ProbeSink<Part>>([](Part&&, ItemContext&) {}));
    } else {
      p->add("apply", std::make_unique<Apply>(loop)).add("sink", null_sink_for_tokens());
    }
    return p;
  };
  CHECK_THROWS_WITH(build("aply")->run(),
                    "stage 'forward' takes tokens from 'aply', which is not a stage of this "
                    "pipeline");
  CHECK_THROWS_WITH(build("numbers")->run(),
                    doctest::Contains("stage 'forward' takes tokens from 'numbers', a source: "
                                      "only a flat map sends tokens"));
  CHECK_THROWS_WITH(build("forward")->run(), doctest::Contains("which is not downstream of it"));
  CHECK_THROWS_WITH(build("apply", /*apply_is_map=*/true)->run(),
                    doctest::Contains("'apply', a map: only a flat map sends tokens"));
  CHECK(graph_text(build("apply")->decls()).find("tokens from apply") != std::string::npos);
}

TEST_CASE("Pipeline.Token.YamlNamesTheEdge" * doctest::timeout(60)) {
  const std::string text = R"(
stages:
  - {type: sequence, name: numbers, params: {count: 10}}
  - {type: spin, name: work, token_from: batchs}
  - {type: batch, name: batches, params: {size: 2}}
  - {type: discard, name: sink}
)";
  CHECK_THROWS_WITH(parse_pipeline_config(text, "cfg.yaml"),
                    doctest::Contains("stage 'work' takes tokens from 'batchs', which is not a "
                                      "stage of this pipeline"));
  const PipelineConfig ok =
      parse_pipeline_config(text, "cfg.yaml", {"stages.work.token_from=batches"});
  CHECK(ok.stages[1].options.token_from == "batches");
}
