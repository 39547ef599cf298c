// Pipelines that are graphs, not chains: fan-out, join, side branches, and their checks.

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <map>
#include <numeric>
#include <random>
#include <thread>

#include "graph/config.hpp"
#include "graph/error.hpp"
#include "graph/pipeline.hpp"
#include "stages/util/batch.hpp"
#include "tests/test_stages.hpp"

using namespace flowtrain;
using namespace flowtrain::testing;

namespace {

// A map that multiplies by `factor` after a pseudo-random pause of up to `max_sleep_us`
// (different per item, so concurrent invocations finish out of order), and drops the items
// `drop` says to.
std::unique_ptr<ProbeMap<>> scale(std::uint64_t factor,
                                  std::int64_t max_sleep_us = 0,
                                  std::function<bool(std::uint64_t)> drop = {}) {
  return std::make_unique<ProbeMap<>>(
      [=](std::uint64_t&& v, ItemContext& ctx) -> std::optional<std::uint64_t> {
        if (max_sleep_us > 0) sleep_us(static_cast<std::int64_t>((v * 7919) % (max_sleep_us + 1)));
        if (drop && drop(v)) return ctx.drop("dropped " + std::to_string(v));
        return v * factor;
      });
}

// Sums the parts of each item; records how many parts it saw.
class SumJoin final : public Join<std::uint64_t, std::uint64_t> {
 public:
  std::atomic<std::size_t> calls{0};
  std::atomic<std::int64_t> active{0};
  std::atomic<std::int64_t> peak{0};

 protected:
  std::optional<std::uint64_t> process(std::vector<std::uint64_t>&& parts, ItemContext&) override {
    raise_max(peak, active.fetch_add(1) + 1);
    sleep_us(static_cast<std::int64_t>(parts[0] % 50));
    ++calls;
    active.fetch_sub(1);
    return std::accumulate(parts.begin(), parts.end(), std::uint64_t{0});
  }
};

// A sink that keeps what it receives by sequence number.
class MapSink final : public Sink<std::uint64_t> {
 public:
  std::mutex mutex;
  std::map<std::uint64_t, std::uint64_t> by_seq;

 protected:
  void consume(std::uint64_t&& v, ItemContext& ctx) override {
    std::lock_guard lock(mutex);
    CHECK(by_seq.emplace(ctx.seq(), v).second);
  }
};

std::unique_ptr<Stage> null_sink_for_tests() {
  return std::make_unique<ProbeSink<>>([](std::uint64_t&&, ItemContext&) {});
}

// An input type that cannot be copied, so its stage cannot share an output.
struct MoveOnly {
  std::unique_ptr<int> p;
};

}  // namespace

TEST_CASE("Pipeline.Dag.FanOutGivesEveryConsumerItsOwnValue" * doctest::timeout(60)) {
  // 'bump' changes the value it receives; 'keep', reading the same output, must not see that.
  Pipeline p;
  auto* keep = new MapSink;
  auto* bumped = new MapSink;
  p.add("numbers", std::make_unique<CountSource<Tracked>>(500));
  p.add("bump",
        std::make_unique<ProbeMap<Tracked, std::uint64_t>>([](Tracked&& t, ItemContext&) {
          t.value += 1000;
          return std::optional<std::uint64_t>(t.value);
        }),
        {.concurrency = 2, .queue_capacity = 4});
  p.add("bumped", std::unique_ptr<Stage>(bumped), {.concurrency = 2});
  p.add("read", std::make_unique<ProbeMap<Tracked, std::uint64_t>>([](Tracked&& t, ItemContext&) {
          return std::optional<std::uint64_t>(t.value);
        }),
        {.concurrency = 2, .queue_capacity = 2, .inputs = {"numbers"}});
  p.add("keep", std::unique_ptr<Stage>(keep));
  const RunReport report = p.run({.threads = 2});
  REQUIRE(keep->by_seq.size() == 500);
  REQUIRE(bumped->by_seq.size() == 500);
  for (std::uint64_t i = 0; i < 500; ++i) {
    CHECK(keep->by_seq[i] == i);
    CHECK(bumped->by_seq[i] == i + 1000);
  }
  CHECK(report.stages[0].items_out == 500);
  CHECK(report.stages[1].items_in == 500);
  CHECK(report.stages[3].items_in == 500);
}

TEST_CASE("Pipeline.Dag.JoinPairsBySequenceUnderConcurrencyAndDrops" * doctest::timeout(120)) {
  // Two branches at different speeds and concurrency, out of order inside each; the join must
  // pair item i of one with item i of the other, drop what either dropped, and never stall,
  // whatever the capacities (down to 1).
  for (const std::size_t capacity : {1, 2, 3, 8}) {
    CAPTURE(capacity);
    Pipeline p;
    auto* join = new SumJoin;
    auto* sink = new MapSink;
    const std::size_t conc = std::min<std::size_t>(capacity, 3);
    p.add("numbers", std::make_unique<CountSource<>>(400));
    p.add("double", scale(2, 80, [](std::uint64_t v) { return v % 7 == 3; }),
          {.concurrency = conc, .queue_capacity = capacity});
    p.add("triple", scale(3, 30), {.concurrency = std::min<std::size_t>(capacity, 2),
                                   .queue_capacity = capacity, .inputs = {"numbers"}});
    p.add("sum", std::unique_ptr<Stage>(join),
          {.concurrency = conc, .queue_capacity = capacity, .inputs = {"double", "triple"}});
    p.add("sink", std::unique_ptr<Stage>(sink), {.concurrency = 2, .queue_capacity = capacity});
    const RunReport report = p.run({.threads = 3});
    std::size_t kept = 0;
    for (std::uint64_t i = 0; i < 400; ++i) {
      if (i % 7 == 3) {
        CHECK(sink->by_seq.count(i) == 0);
      } else {
        CHECK(sink->by_seq.at(i) == 5 * i);
        ++kept;
      }
    }
    CHECK(sink->by_seq.size() == kept);
    CHECK(join->calls == kept);
    CHECK(join->peak <= static_cast<std::int64_t>(conc));
    CHECK(report.stages[1].dropped == 400 - kept);
    CHECK(report.stages[3].items_in == kept);
    CHECK(report.stages[3].dropped == 0);  // the drop is counted once, where it happened
  }
}

TEST_CASE("Pipeline.Dag.BoundedAcrossFanOutAndJoin" * doctest::timeout(60)) {
  // A slow branch holds back the fast one: items alive never exceed what the slots allow.
  Tracked::live = 0;
  Tracked::peak = 0;
  {
    Pipeline p;
    p.add("numbers", std::make_unique<CountSource<Tracked>>(300));
    p.add("fast", std::make_unique<ProbeMap<Tracked, std::uint64_t>>([](Tracked&& t, ItemContext&) {
            return std::optional<std::uint64_t>(t.value);
          }),
          {.concurrency = 2, .queue_capacity = 4});
    p.add("slow", std::make_unique<ProbeMap<Tracked, std::uint64_t>>([](Tracked&& t, ItemContext&) {
            sleep_us(200);
            return std::optional<std::uint64_t>(t.value);
          }),
          {.queue_capacity = 3, .inputs = {"numbers"}});
    p.add("sum", std::make_unique<SumJoin>(), {.queue_capacity = 4, .inputs = {"fast", "slow"}});
    p.add("sink", null_sink_for_tests());
    p.run({.threads = 2});
  }
  // numbers' output has the smaller of its consumers' capacities (3) as slots; each item there
  // is one value and one copy. Add the three being processed and the one the source holds.
  CHECK(Tracked::peak <= 12);
  CHECK(Tracked::live == 0);
}

TEST_CASE("Pipeline.Dag.SideBranchSinkAndOrder" * doctest::timeout(60)) {
  // A side sink on a branch; the main sink still gets everything in order.
  Pipeline p;
  auto* side = new MapSink;
  auto* main = new RecordSink;
  p.add("numbers", std::make_unique<CountSource<>>(1000));
  p.add("work", scale(1, 20), {.concurrency = 2});
  p.add("side", std::unique_ptr<Stage>(side), {.concurrency = 2});
  p.add("main", std::unique_ptr<Stage>(main), {.ordered = true, .inputs = {"work"}});
  p.run({.threads = 2});
  CHECK(side->by_seq.size() == 1000);
  std::vector<std::uint64_t> expected(1000);
  std::iota(expected.begin(), expected.end(), 0);
  CHECK(main->values == expected);
}

TEST_CASE("Pipeline.Dag.ErrorInOneBranchSurfaces" * doctest::timeout(60)) {
  Pipeline p;
  p.add("numbers", std::make_unique<CountSource<>>(-1));
  p.add("a", scale(1), {.concurrency = 2});
  p.add("b",
        std::make_unique<ProbeMap<>>([](std::uint64_t&& v, ItemContext&) -> std::optional<std::uint64_t> {
          if (v == 77) throw std::runtime_error("bad value");
          return v;
        }),
        {.inputs = {"numbers"}});
  p.add("sum", std::make_unique<SumJoin>(), {.inputs = {"a", "b"}});
  p.add("sink", null_sink_for_tests());
  CHECK_THROWS_WITH_AS(p.run({.threads = 2}), "stage 'b' failed on item 77: bad value", StageError);
}

TEST_CASE("Pipeline.Dag.ChecksTheGraph") {
  auto source = [] { return std::make_unique<CountSource<>>(10); };
  SUBCASE("unknown input") {
    Pipeline p;
    p.add("numbers", source());
    p.add("m", scale(1), {.inputs = {"numbrs"}});
    CHECK_THROWS_WITH_AS(p.check(),
                         "stage 'm' takes input 'numbrs', which is not a stage listed before it; "
                         "list each stage after its inputs",
                         Error);
  }
  SUBCASE("a join needs two inputs, a map one") {
    Pipeline p;
    p.add("numbers", source());
    p.add("a", scale(1));
    p.add("sum", std::make_unique<SumJoin>());
    CHECK_THROWS_WITH_AS(p.check(),
                         "stage 'sum' is a join and takes two or more inputs, not 1 (inputs: 'a')",
                         Error);
    Pipeline q;
    q.add("numbers", source());
    q.add("a", scale(1));
    q.add("m", scale(1), {.inputs = {"numbers", "a"}});
    CHECK_THROWS_WITH_AS(q.check(),
                         "stage 'm' is a map and takes one input, not 2 (inputs: 'numbers', 'a')",
                         Error);
  }
  SUBCASE("a join's inputs must be numbered alike") {
    Pipeline p;
    p.add("numbers", source());
    p.add<stages::BatchStage>("batch");
    p.add("sizes", std::make_unique<ProbeMap<std::vector<std::uint64_t>, std::uint64_t>>(
                       [](std::vector<std::uint64_t>&& b, ItemContext&) {
                         return std::optional<std::uint64_t>(b.size());
                       }));
    p.add("sum", std::make_unique<SumJoin>(), {.inputs = {"numbers", "sizes"}});
    CHECK_THROWS_WITH_AS(
        p.check(),
        "join 'sum' pairs items by sequence number, but its inputs 'numbers' and 'sizes' are "
        "numbered by different stages ('numbers' and 'batch'); join branches of one source or "
        "flat map",
        Error);
  }
  SUBCASE("after a sink, name the input") {
    Pipeline p;
    p.add("numbers", source());
    p.add("side", null_sink_for_tests());
    p.add("m", scale(1));
    CHECK_THROWS_WITH_AS(p.check(),
                         "stage 'm' takes its items from the sink 'side', which emits none; name "
                         "its input with `inputs: [...]`",
                         Error);
  }
  SUBCASE("an output nobody takes") {
    Pipeline p;
    p.add("numbers", source());
    p.add("lost", scale(1));
    p.add("sink", null_sink_for_tests(), {.inputs = {"numbers"}});
    CHECK_THROWS_WITH_AS(p.run(),
                         "the output of 'lost' goes nowhere: no stage takes it as input; end that "
                         "branch with a sink (type: discard)",
                         Error);
  }
  SUBCASE("a shared output needs copyable consumers") {
    Pipeline p;
    p.add("numbers", source());
    p.add("wrap", std::make_unique<ProbeMap<std::uint64_t, MoveOnly>>(
                      [](std::uint64_t&&, ItemContext&) { return std::optional<MoveOnly>(); }));
    p.add("a", std::make_unique<ProbeSink<MoveOnly>>([](MoveOnly&&, ItemContext&) {}));
    p.add("b", std::make_unique<ProbeSink<MoveOnly>>([](MoveOnly&&, ItemContext&) {}),
          {.inputs = {"wrap"}});
    CHECK_THROWS_WITH_AS(
        p.check(),
        doctest::Contains("'a' cannot share the output of 'wrap' with other stages: its input "
                          "type"),
        Error);
  }
  SUBCASE("the graph as text") {
    Pipeline p;
    p.add("numbers", source());
    p.add("a", scale(1), {.concurrency = 2});
    p.add("b", scale(1), {.queue_capacity = 4, .inputs = {"numbers"}});
    p.add("sum", std::make_unique<SumJoin>(), {.inputs = {"a", "b"}});
    p.add("sink", null_sink_for_tests(), {.ordered = true});
    CHECK(graph_text(p.decls()) ==
          "numbers  source    concurrency 1\n"
          "a        map       <- numbers  concurrency 2, queue 8\n"
          "b        map       <- numbers  concurrency 1, queue 4\n"
          "sum      join      <- a, b  concurrency 1, queue 8\n"
          "sink     sink      <- sum  concurrency 1, queue 8, ordered\n");
  }
}

TEST_CASE("Config.Dag.InputsFromYaml" * doctest::timeout(60)) {
  Registry registry = Registry::global();
  registry.add({"sum_join", {"test join", {}}, SumJoin::static_shape(), [](const Params&, const BuildContext&) {
                  return std::unique_ptr<Stage>(new SumJoin);
                }});
  const std::string text = R"(threads: 2
stages:
  - {type: sequence, name: numbers, params: {count: 300}}
  - {type: spin, name: a, concurrency: 2, params: {rounds: 500}}
  - {type: spin, name: b, inputs: numbers, params: {rounds: 100}}
  - {type: sum_join, name: sum, inputs: [a, b]}
  - {type: discard}
)";
  const PipelineConfig config = parse_pipeline_config(text, "dag.yaml", {}, registry);
  CHECK(config.stages[3].options.inputs == std::vector<std::string>{"a", "b"});
  const RunReport report = build_pipeline(config, registry)->run(config.run);
  CHECK(report.stages[3].items_in == 300);
  CHECK(report.stages[4].items_in == 300);

  CHECK_THROWS_WITH_AS(
      parse_pipeline_config(
          R"(stages:
  - {type: sequence, name: numbers}
  - {type: spin, name: a}
  - {type: sum_join, name: sum, inputs: [a, numbrs]}
  - {type: discard}
)",
          "dag.yaml", {}, registry),
      "dag.yaml:4: stage 'sum' (sum_join): input 'numbrs' is not a stage listed before this one "
      "(did you mean 'numbers'?)",
      Error);
}

namespace {

// Sends even numbers to "even", odd ones to "odd".
class Parity final : public Router<std::uint64_t, std::uint64_t> {
 public:
  static StageShape static_shape() { return shape_with_outputs({"even", "odd"}); }
  StageShape shape() const override { return static_shape(); }

 protected:
  std::optional<Routed<std::uint64_t>> process(std::uint64_t&& n, ItemContext& ctx) override {
    if (n % 25 == 24) return ctx.drop("every 25th");
    return Routed<std::uint64_t>{n % 2, n};
  }
};

}  // namespace

TEST_CASE("Pipeline.Dag.RouteAroundAStageAndMergeInOrder" * doctest::timeout(60)) {
  // Odd numbers go through a slow stage, even ones around it; the merge gives them back in
  // order, and the slow stage works only on what was routed to it.
  for (const std::size_t capacity : {1, 4}) {
    CAPTURE(capacity);
    Pipeline p;
    auto* sink = new RecordSink;
    p.add("numbers", std::make_unique<CountSource<>>(1000));
    p.add("parity", std::make_unique<Parity>(),
          {.concurrency = std::min<std::size_t>(capacity, 2), .queue_capacity = 2});
    p.add("slow", scale(10, 40), {.concurrency = std::min<std::size_t>(capacity, 2),
                                  .queue_capacity = capacity, .inputs = {"parity.odd"}});
    p.add("merge", std::make_unique<MergeStage>(),
          {.queue_capacity = capacity, .inputs = {"parity.even", "slow"}});
    p.add("sink", std::unique_ptr<Stage>(sink), {.ordered = true});
    const RunReport report = p.run({.threads = 3});
    std::vector<std::uint64_t> expected;
    for (std::uint64_t n = 0; n < 1000; ++n) {
      if (n % 25 != 24) expected.push_back(n % 2 == 0 ? n : 10 * n);
    }
    CHECK(sink->values == expected);
    CHECK(report.stages[1].dropped == 40);
    CHECK(report.stages[2].items_in == 480);  // the odd ones only (20 of the 500 were dropped)
    CHECK(report.stages[3].items_in == 960);
  }
}

TEST_CASE("Pipeline.Dag.RouterOutputsAreChecked") {
  auto source = [] { return std::make_unique<CountSource<>>(10); };
  SUBCASE("a router's output must be named") {
    Pipeline p;
    p.add("numbers", source());
    p.add("parity", std::make_unique<Parity>());
    p.add("m", scale(1));
    CHECK_THROWS_WITH_AS(p.check(),
                         "stage 'm' takes input 'parity', a router: name one of its outputs "
                         "('parity.even', 'parity.odd')",
                         Error);
    Pipeline q;
    q.add("numbers", source());
    q.add("parity", std::make_unique<Parity>());
    q.add("m", scale(1), {.inputs = {"parity.eve"}});
    CHECK_THROWS_WITH_AS(q.check(),
                         "stage 'm' takes input 'parity.eve', but router 'parity' has no output "
                         "'eve' (its outputs: 'parity.even', 'parity.odd')",
                         Error);
  }
  SUBCASE("every output goes somewhere") {
    Pipeline p;
    p.add("numbers", source());
    p.add("parity", std::make_unique<Parity>());
    p.add("sink", null_sink_for_tests(), {.inputs = {"parity.even"}});
    CHECK_THROWS_WITH_AS(p.run(),
                         "the output 'parity.odd' goes nowhere: no stage takes it as input; end "
                         "that branch with a sink (type: discard)",
                         Error);
  }
  SUBCASE("a merge of branches that both carry the item fails naming it") {
    Pipeline p;
    p.add("numbers", source());
    p.add("a", scale(1));
    p.add("b", scale(1), {.inputs = {"numbers"}});
    p.add("merge", std::make_unique<MergeStage>(), {.inputs = {"a", "b"}});
    p.add("sink", null_sink_for_tests());
    CHECK_THROWS_WITH_AS(p.run({.threads = 1}),
                         "stage 'merge' failed on item 0: it got the item from 2 of its inputs; a "
                         "merge takes the branches of one router, which sends each item down one",
                         StageError);
  }
  SUBCASE("a merge's inputs emit one type") {
    Pipeline p;
    p.add("numbers", source());
    p.add("parity", std::make_unique<Parity>());
    p.add("text", std::make_unique<ProbeMap<std::uint64_t, std::string>>(
                      [](std::uint64_t&& n, ItemContext&) {
                        return std::optional<std::string>(std::to_string(n));
                      }),
          {.inputs = {"parity.odd"}});
    p.add("merge", std::make_unique<MergeStage>(), {.inputs = {"parity.even", "text"}});
    CHECK_THROWS_WITH_AS(
        p.check(),
        "merge 'merge' passes on one item type, but 'parity.even' emits unsigned long and 'text' "
        "emits std::string",
        Error);
  }
}

TEST_CASE("Config.Dag.RouterAndMergeFromYaml" * doctest::timeout(60)) {
  Registry registry = Registry::global();
  registry.add({"parity", {"test router", {}}, Parity::static_shape(), [](const Params&, const BuildContext&) {
                  return std::unique_ptr<Stage>(new Parity);
                }});
  const PipelineConfig config = parse_pipeline_config(R"(threads: 2
stages:
  - {type: sequence, name: numbers, params: {count: 200}}
  - {type: parity}
  - {type: spin, name: odd_work, inputs: parity.odd, concurrency: 2, params: {rounds: 100}}
  - {type: merge, inputs: [parity.even, odd_work]}
  - {type: discard}
)",
                                                      "route.yaml", {}, registry);
  const RunReport report = build_pipeline(config, registry)->run(config.run);
  CHECK(report.stages[2].items_in == 96);   // odd, less every 25th
  CHECK(report.stages[4].items_in == 192);
  CHECK(graph_text(stage_decls(config, registry)).find("merge     merge     <- parity.even, odd_work") !=
        std::string::npos);
}

namespace {

// A map whose invocation of item 0 waits until the run is cancelled (Stage::cancel), then fails
// as a cancelled stage does ("the run failed in another stage"). Its cancel() lets that
// invocation throw first and only then returns to the failing thread, so TBB sees the reaction
// before the cause.
class WaitsForCancel final : public Map<std::uint64_t, std::uint64_t> {
 public:
  std::atomic<bool> waiting{false};  // item 0's invocation has started

  void cancel() override {
    {
      std::lock_guard lock(mutex_);
      cancelled_ = true;
    }
    changed_.notify_all();
    std::unique_lock lock(mutex_);
    changed_.wait_for(lock, std::chrono::seconds(5), [&] { return reacted_; });
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // its throw reaches TBB
  }

 protected:
  std::optional<std::uint64_t> process(std::uint64_t&& v, ItemContext&) override {
    if (v != 0) return v;
    std::unique_lock lock(mutex_);
    waiting = true;
    changed_.wait(lock, [&] { return cancelled_; });
    reacted_ = true;
    changed_.notify_all();
    throw Error("the run failed in another stage");
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool cancelled_ = false;
  bool reacted_ = false;
};

}  // namespace

// The run's error is the cause, never a cancelled stage's reaction to it, whichever reaches TBB
// first (issue 59: a partition's "the run failed in another stage" once hid jpeg_decode's error).
TEST_CASE("Pipeline.Dag.TheRunReportsTheCauseNotTheReaction" * doctest::timeout(60)) {
  for (int round = 0; round < 3; ++round) {
    Pipeline p;
    auto* waits = new WaitsForCancel;
    p.add("numbers", std::make_unique<CountSource<>>(-1));
    p.add("waits", std::unique_ptr<Stage>(waits));
    p.add("fails",
          std::make_unique<ProbeMap<>>([waits](std::uint64_t&& v, ItemContext&) -> std::optional<std::uint64_t> {
            while (!waits->waiting) std::this_thread::sleep_for(std::chrono::milliseconds(1));
            throw std::runtime_error("bad value " + std::to_string(v));
          }),
          {.inputs = {"numbers"}});
    p.add("sum", std::make_unique<SumJoin>(), {.inputs = {"waits", "fails"}});
    p.add("sink", null_sink_for_tests());
    CHECK_THROWS_WITH_AS(p.run({.threads = 2}), "stage 'fails' failed on item 0: bad value 0",
                         StageError);
  }
}
