#include <doctest/doctest.h>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <thread>

#include "graph/error.hpp"
#include "graph/pipeline.hpp"
#include "stages/util/batch.hpp"
#include "tests/test_stages.hpp"

using namespace flowtrain;
using namespace flowtrain::testing;

namespace {

std::unique_ptr<ProbeMap<>> identity_map(std::int64_t sleep_micros = 0) {
  return std::make_unique<ProbeMap<>>([sleep_micros](std::uint64_t&& v, ItemContext&) {
    if (sleep_micros > 0) sleep_us(sleep_micros);
    return std::optional<std::uint64_t>(v);
  });
}

std::unique_ptr<Stage> null_sink() {
  return std::make_unique<ProbeSink<>>([](std::uint64_t&&, ItemContext&) {});
}

}  // namespace

TEST_CASE("Pipeline.Backpressure.BoundedInFlight" * doctest::timeout(60)) {
  constexpr std::size_t kMapCapacity = 6;
  constexpr std::size_t kSinkCapacity = 4;
  std::atomic<std::int64_t> produced{0}, map_started{0}, sink_started{0};
  std::atomic<std::int64_t> max_source_edge{0}, max_map_edge{0};

  Pipeline p;
  p.add("source", std::make_unique<CountSource<>>(400, [&](std::uint64_t) {
          const std::int64_t now = produced.fetch_add(1) + 1;
          raise_max(max_source_edge, now - map_started.load());
        }));
  p.add("map", std::make_unique<ProbeMap<>>([&](std::uint64_t&& v, ItemContext&) {
          const std::int64_t now = map_started.fetch_add(1) + 1;
          raise_max(max_map_edge, now - sink_started.load());
          return std::optional<std::uint64_t>(v);
        }),
        {.concurrency = 2, .queue_capacity = kMapCapacity});
  p.add("slow_sink", std::make_unique<ProbeSink<>>([&](std::uint64_t&&, ItemContext&) {
          sink_started.fetch_add(1);
          sleep_us(300);
        }),
        {.queue_capacity = kSinkCapacity});
  const RunReport r = p.run({.threads = 2});

  CHECK(r.stages[2].items_in == 400);
  // Items admitted to the map and not yet taken by the sink never exceed the sink's queue. The
  // sink returns its slot as it starts an item, a moment before this test's sink body counts it,
  // so the count seen here can be one over per sink worker (one).
  CHECK(max_map_edge.load() <= static_cast<std::int64_t>(kSinkCapacity) + 1);
  // The source may hold one produced item while its queue is full; the map's two workers may
  // each have taken a slot back a moment before the test's map body counts the item.
  CHECK(max_source_edge.load() <= static_cast<std::int64_t>(kMapCapacity) + 1 + 2);
  // The sink was the bottleneck: the queue in front of it was full most of the time.
  CHECK(r.stages[2].queue_max <= static_cast<double>(kSinkCapacity));
  CHECK(r.stages[2].queue_mean > 1.0);
  CHECK(r.bottleneck() == std::optional<std::size_t>(2));
}

TEST_CASE("Pipeline.Backpressure.MemoryFlat" * doctest::timeout(60)) {
  Tracked::live = 0;
  Tracked::peak = 0;
  Pipeline p;
  p.add("source", std::make_unique<CountSource<Tracked>>(20000));
  p.add("map", std::make_unique<ProbeMap<Tracked>>([](Tracked&& t, ItemContext&) {
          return std::optional<Tracked>(Tracked(t.value + 1));
        }),
        {.concurrency = 2, .queue_capacity = 8});
  p.add("sink", std::make_unique<ProbeSink<Tracked>>([](Tracked&&, ItemContext&) { sleep_us(5); }),
        {.queue_capacity = 8});
  const RunReport r = p.run({.threads = 2});
  CHECK(r.stages[2].items_in == 20000);
  CHECK(Tracked::live.load() == 0);
  // Bounded by the queues (8 + 8), the source's held item and the values being worked on (an
  // input and an output per running invocation); without bounded queues this reaches thousands.
  CHECK(Tracked::peak.load() <= 8 + 8 + 1 + 2 * 3 + 2);
}

TEST_CASE("Pipeline.Concurrency.PeakEqualsConfigured" * doctest::timeout(60)) {
  constexpr std::size_t kThreads = 4;
  struct Case {
    std::size_t concurrency;
    std::int64_t expected;
  };
  for (const Case c : {Case{kSerial, 1}, Case{3, 3}, Case{kUnlimited, std::int64_t{kThreads}}}) {
    CAPTURE(c.concurrency);
    // The first wave of invocations waits (up to 5 s) until the expected number run at once, so
    // a loaded machine that is slow to wake threads cannot make the peak come out low.
    std::atomic<std::int64_t> running{0}, started{0};
    auto map = std::make_unique<ProbeMap<>>([&](std::uint64_t&& v, ItemContext&) {
      running.fetch_add(1);
      const bool first_wave = started.fetch_add(1) < c.expected;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (first_wave && running.load() < c.expected &&
             std::chrono::steady_clock::now() < deadline) {
        sleep_us(100);
      }
      sleep_us(2000);  // time for one more invocation to start, were the limit broken
      running.fetch_sub(1);
      return std::optional<std::uint64_t>(v);
    });
    ProbeMap<>& probe = *map;
    Pipeline p;
    p.add("source", std::make_unique<CountSource<>>(48));
    p.add("work", std::move(map), {.concurrency = c.concurrency, .queue_capacity = 16});
    p.add("sink", null_sink(), {.queue_capacity = 16});
    const RunReport r = p.run({.threads = kThreads});
    CHECK(probe.peak.load() == c.expected);
    CHECK(r.stages[1].peak_active == static_cast<std::size_t>(c.expected));
    CHECK(r.stages[1].workers == static_cast<std::size_t>(c.expected));
  }
}

TEST_CASE("Pipeline.Order.OrderedStageUnderConcurrency4" * doctest::timeout(60)) {
  constexpr std::uint64_t kItems = 400;
  auto scramble = std::make_unique<ProbeMap<>>([](std::uint64_t&& v, ItemContext&) {
    sleep_us(static_cast<std::int64_t>((v * 7919) % 13) * 40);  // uneven work reorders items
    return std::optional<std::uint64_t>(v * 3);
  });
  auto sink = std::make_unique<RecordSink>();
  RecordSink& record = *sink;
  Pipeline p;
  p.add("source", std::make_unique<CountSource<>>(static_cast<std::int64_t>(kItems)));
  p.add("scramble", std::move(scramble), {.concurrency = 4, .queue_capacity = 8});
  p.add("ordered_sink", std::move(sink), {.queue_capacity = 8, .ordered = true});
  p.run({.threads = 4});

  REQUIRE(record.seqs.size() == kItems);
  for (std::uint64_t i = 0; i < kItems; ++i) {
    REQUIRE(record.seqs[i] == i);
    REQUIRE(record.values[i] == 3 * i);
  }
}

TEST_CASE("Pipeline.Order.BatchesIdenticalAcrossConcurrency" * doctest::timeout(60)) {
  auto run_batches = [](std::size_t concurrency) {
    std::vector<std::vector<std::uint64_t>> batches;
    Params params = Params::defaults(stages::BatchStage::describe().params);
    params.set("size", std::int64_t{10});
    Pipeline p;
    p.add("source", std::make_unique<CountSource<>>(205));
    p.add("scramble", std::make_unique<ProbeMap<>>([](std::uint64_t&& v, ItemContext&) {
            sleep_us(static_cast<std::int64_t>((v * 31) % 7) * 30);
            return std::optional<std::uint64_t>(v);
          }),
          {.concurrency = concurrency, .queue_capacity = 8});
    p.add("batch", std::make_unique<stages::BatchStage>(params), {.queue_capacity = 8});
    p.add("sink",
          std::make_unique<ProbeSink<std::vector<std::uint64_t>>>(
              [&](std::vector<std::uint64_t>&& b, ItemContext&) { batches.push_back(b); }),
          {.queue_capacity = 4});
    p.run({.threads = 4});
    return batches;
  };
  const auto serial = run_batches(1);
  const auto parallel = run_batches(4);
  REQUIRE(serial.size() == 21);  // 20 full batches and the last, smaller one
  CHECK(serial.back().size() == 5);
  CHECK(serial == parallel);
  std::vector<std::uint64_t> flat;
  for (const auto& b : serial) flat.insert(flat.end(), b.begin(), b.end());
  std::vector<std::uint64_t> expected(205);
  std::iota(expected.begin(), expected.end(), 0);
  CHECK(flat == expected);
}

TEST_CASE("Pipeline.Errors.StageExceptionSurfacesWithNameAndItem" * doctest::timeout(60)) {
  Pipeline p;
  p.add("source", std::make_unique<CountSource<>>(-1));  // endless: only the error can end it
  p.add("fine", identity_map(), {.concurrency = 2});
  p.add("explode", std::make_unique<ProbeMap<>>([](std::uint64_t&& v, ItemContext&) {
          if (v == 37) throw std::runtime_error("boom");
          return std::optional<std::uint64_t>(v);
        }),
        {.concurrency = 2});
  p.add("sink", null_sink(), {.ordered = true});
  try {
    p.run({.threads = 2});
    FAIL("run() returned although a stage threw");
  } catch (const StageError& e) {
    CHECK(e.stage() == "explode");
    CHECK(e.item() == 37);
    CHECK(std::string(e.what()) == "stage 'explode' failed on item 37: boom");
  }
}

TEST_CASE("Pipeline.Errors.SourceAndSinkAndFinishExceptions" * doctest::timeout(60)) {
  SUBCASE("source") {
    Pipeline p;
    p.add("source", std::make_unique<CountSource<>>(100, [](std::uint64_t i) {
            if (i == 5) throw std::runtime_error("disk gone");
          }));
    p.add("sink", null_sink());
    CHECK_THROWS_WITH_AS(p.run({.threads = 2}), "stage 'source' failed on item 5: disk gone",
                         StageError);
  }
  SUBCASE("sink") {
    Pipeline p;
    p.add("source", std::make_unique<CountSource<>>(100));
    p.add("sink", std::make_unique<ProbeSink<>>([](std::uint64_t&& v, ItemContext&) {
            if (v == 99) throw std::runtime_error("full");
          }),
          {.concurrency = kUnlimited});
    CHECK_THROWS_WITH_AS(p.run({.threads = 2}), "stage 'sink' failed on item 99: full", StageError);
  }
  SUBCASE("flat map finish") {
    class FailingFinish final : public FlatMap<std::uint64_t, std::uint64_t> {
     protected:
      void process(std::uint64_t&& v, Emitter<std::uint64_t>& out) override { out.emit(v); }
      void finish(Emitter<std::uint64_t>&) override { throw std::runtime_error("flush failed"); }
    };
    Pipeline p;
    p.add("source", std::make_unique<CountSource<>>(10));
    p.add("group", std::make_unique<FailingFinish>());
    p.add("sink", null_sink());
    CHECK_THROWS_WITH_AS(p.run({.threads = 2}), "stage 'group' failed on item 10: flush failed",
                         StageError);
  }
}

TEST_CASE("Pipeline.Stop.RequestStopDrainsWithoutHang" * doctest::timeout(60)) {
  std::atomic<std::int64_t> consumed{0};
  Pipeline p;
  p.add("endless", std::make_unique<CountSource<>>(-1));
  p.add("work", identity_map(50), {.concurrency = 2});
  p.add("sink", std::make_unique<ProbeSink<>>(
                    [&](std::uint64_t&&, ItemContext&) { consumed.fetch_add(1); }));
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    p.request_stop();
  });
  const RunReport r = p.run({.threads = 2});
  stopper.join();
  CHECK(r.stopped);
  CHECK(consumed.load() > 0);
  // Everything the source produced was finished: nothing lost in the queues.
  CHECK(r.stages[0].items_out == static_cast<std::uint64_t>(consumed.load()));
  CHECK(r.stages[2].items_in == r.stages[0].items_out);
}

TEST_CASE("Pipeline.Stop.SigintStopsSources" * doctest::timeout(60)) {
  Pipeline p;
  p.add("endless", std::make_unique<CountSource<>>(-1));
  p.add("work", identity_map(100), {.concurrency = 2});
  p.add("sink", null_sink());
  StopOnSignal on_signal(p);
  std::thread sender([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    std::raise(SIGINT);
  });
  const RunReport r = p.run({.threads = 2});
  sender.join();
  CHECK(r.stopped);
  CHECK(r.stages[2].items_in == r.stages[0].items_out);
  CHECK(format_report(r).find("stopped early on request (SIGINT)") != std::string::npos);
}

TEST_CASE("Pipeline.Metrics.ItemsAddUp" * doctest::timeout(60)) {
  Pipeline p;
  p.add("source", std::make_unique<CountSource<>>(1000));
  p.add("filter",
        std::make_unique<ProbeMap<>>(
            [](std::uint64_t&& v, ItemContext& ctx) -> std::optional<std::uint64_t> {
              if (v % 10 == 3) return ctx.drop("value " + std::to_string(v) + " ends in 3");
              return v;
            }),
        {.concurrency = 2});
  p.add("work", identity_map(), {.concurrency = 2});
  p.add("sink", null_sink(), {.ordered = true});
  const RunReport r = p.run({.threads = 2});

  const StageReport& filter = r.stages[1];
  CHECK(r.stages[0].items_out == 1000);
  CHECK(filter.items_in == 1000);
  CHECK(filter.dropped == 100);
  CHECK(filter.items_in == filter.items_out + filter.dropped);
  CHECK(r.stages[2].items_in == filter.items_out);  // dropped items do not reach later stages
  CHECK(r.stages[3].items_in == 900);
  REQUIRE(filter.drops.size() == 100);
  CHECK(filter.drops[0].reason.find("ends in 3") != std::string::npos);
  CHECK(filter.drops[0].seq % 10 == 3);
  const std::string text = format_report(r);
  CHECK(text.find("dropped by 'filter': 100 item(s)") != std::string::npos);
  for (const StageReport& s : r.stages) {
    CHECK(s.busy_fraction >= 0.0);
    CHECK(s.starved_fraction + s.blocked_fraction <= 1.0 + 1e-9);
  }
}

TEST_CASE("Pipeline.Metrics.BottleneckVerdictNamesTheSlowStage" * doctest::timeout(60)) {
  Pipeline p;
  p.add("source", std::make_unique<CountSource<>>(300));
  p.add("cheap", identity_map(), {.concurrency = 2});
  p.add("slow", identity_map(500), {.concurrency = 1});
  p.add("sink", null_sink());
  const RunReport r = p.run({.threads = 2});
  REQUIRE(r.bottleneck().has_value());
  CHECK(r.stages[*r.bottleneck()].name == "slow");
  CHECK(r.stages[2].busy_fraction > 0.8);
  CHECK(r.verdict().rfind("'slow' is the bottleneck", 0) == 0);
  CHECK(r.verdict().find("raise stages.slow.concurrency") != std::string::npos);
}

TEST_CASE("Pipeline.Trace.WritesChromeTraceEvents" * doctest::timeout(60)) {
  const std::string path = "pipeline_test.trace.json";
  Pipeline p;
  p.add("source", std::make_unique<CountSource<>>(50));
  p.add("work", identity_map(), {.concurrency = 2});
  p.add("sink", null_sink());
  const RunReport r = p.run({.threads = 2, .trace_path = path});
  CHECK(r.trace_path == path);
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(text.rfind("{\"displayTimeUnit\"", 0) == 0);
  std::size_t spans = 0;
  for (auto pos = text.find("\"ph\":\"X\""); pos != std::string::npos;
       pos = text.find("\"ph\":\"X\"", pos + 1)) {
    ++spans;
  }
  // One span per item per stage, the source's last call that found it exhausted, and the
  // sink's finish.
  CHECK(spans == 152);
  std::remove(path.c_str());
}

TEST_CASE("Pipeline.Add.RejectsBadLinks") {
  SUBCASE("type mismatch") {
    Pipeline p;
    p.add("source", std::make_unique<CountSource<>>(1));
    CHECK_THROWS_WITH_AS(
        p.add("sink", std::make_unique<ProbeSink<std::string>>([](std::string&&, ItemContext&) {})),
        "item type mismatch: 'sink' takes std::string, but 'source' emits unsigned long", Error);
  }
  SUBCASE("first stage not a source") {
    Pipeline p;
    CHECK_THROWS_WITH_AS(p.add("m", identity_map()),
                         "the first stage 'm' must be a source, not a map", Error);
  }
  SUBCASE("flat map is serial") {
    Pipeline p;
    p.add("source", std::make_unique<CountSource<>>(1));
    Params params = Params::defaults(stages::BatchStage::describe().params);
    CHECK_THROWS_WITH_AS(
        p.add("batch", std::make_unique<stages::BatchStage>(params), {.concurrency = 2}),
        "stage 'batch': concurrency 2 is not allowed: a flat map runs serially", Error);
  }
  SUBCASE("queue smaller than the producer's concurrency") {
    Pipeline p;
    p.add("source", std::make_unique<CountSource<>>(1));
    p.add("m", identity_map(), {.concurrency = 4});
    CHECK_THROWS_WITH_AS(p.add("sink", null_sink(), {.queue_capacity = 2}),
                         doctest::Contains("queue_capacity 2 of 'sink' is below the concurrency 4"),
                         Error);
  }
  SUBCASE("no sink") {
    Pipeline p;
    p.add("source", std::make_unique<CountSource<>>(1));
    p.add("m", identity_map());
    CHECK_THROWS_AS(p.run(), Error);
  }
}

TEST_CASE("Pipeline.Progress.ReportedWhileRunning" * doctest::timeout(60)) {
  std::vector<Progress> seen;  // called from one background thread only
  Pipeline p;
  p.add("source", std::make_unique<CountSource<>>(400));
  p.add("work", identity_map(1000), {.concurrency = 2});
  p.add("sink", null_sink());
  RunOptions options{.threads = 2};
  options.progress_interval_s = 0.02;
  options.on_progress = [&](const Progress& pr) { seen.push_back(pr); };
  p.run(options);
  REQUIRE(seen.size() >= 3);
  for (std::size_t i = 1; i < seen.size(); ++i) {
    CHECK(seen[i].elapsed_s > seen[i - 1].elapsed_s);
    CHECK(seen[i].completed >= seen[i - 1].completed);
    CHECK(seen[i].completed <= seen[i].produced);
  }
  CHECK(seen.back().completed > 0);
}
