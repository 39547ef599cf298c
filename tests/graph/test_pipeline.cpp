#include <doctest/doctest.h>
#include <sys/mman.h>
#include <time.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <thread>

#include "graph/cpu_usage.hpp"
#include "graph/error.hpp"
#include "graph/pipeline.hpp"
#include "graph/report_io.hpp"
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
  // The sink sleeps 2 ms an item, so the source and map keep its queue full even on a loaded
  // machine (at 300 us, a build beside the test made queue_mean fall under 1).
  p.add("source", std::make_unique<CountSource<>>(150, [&](std::uint64_t) {
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
          sleep_us(2000);
        }),
        {.queue_capacity = kSinkCapacity});
  const RunReport r = p.run({.threads = 2});

  CHECK(r.stages[2].items_in == 150);
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
    Pipeline p;
    p.add("source", std::make_unique<CountSource<>>(205));
    p.add("scramble", std::make_unique<ProbeMap<>>([](std::uint64_t&& v, ItemContext&) {
            sleep_us(static_cast<std::int64_t>((v * 31) % 7) * 30);
            return std::optional<std::uint64_t>(v);
          }),
          {.concurrency = concurrency, .queue_capacity = 8});
    p.add<stages::BatchStage>("batch", {.size = 10}, {.queue_capacity = 8});
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
  CHECK(format_report(r).find("stopped early on request (SIGINT or SIGTERM)") != std::string::npos);
  CHECK(on_signal.received() == SIGINT);
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
  const RunReport r = p.run({.threads = 2, .key_prefix = "phases.main."});
  REQUIRE(r.bottleneck().has_value());
  CHECK(r.stages[*r.bottleneck()].name == "slow");
  CHECK(r.stages[2].busy_fraction > 0.8);
  CHECK(r.key_prefix == "phases.main.");
  CHECK(r.verdict().rfind("'slow' is the bottleneck", 0) == 0);
  // The advice names the key as the config spells it: under its phase, or at the top.
  CHECK(r.verdict().find("raise phases.main.stages.slow.concurrency (now 1)") != std::string::npos);
  RunReport single = r;
  single.key_prefix.clear();
  CHECK(single.verdict().find("; raise stages.slow.concurrency (now 1)") != std::string::npos);
}

TEST_CASE("Pipeline.Cpu.PausedRunsAddUp") {
  // Two runs of a paused pipeline (autotune's trials, then the rest): the report after the
  // second covers both, its CPU figures too (they were the last run's alone: 0.00 CPU-s per
  // wall-s after a long tuning).
  CpuReport first;
  first.interval_s = 0.25;
  first.process_cpu_s = 19;
  first.page_faults = 100;
  first.core_mean = {1.0, 0.9};
  first.times_s = {0.25, 0.5};
  first.cores = {{1, 1}, {0.9, 0.9}};
  CpuReport whole;
  detail::append_cpu(whole, 0, first, 10);
  CHECK(whole.process_cpu_s == 19);
  CpuReport rest = first;
  rest.process_cpu_s = 0.1;
  rest.page_faults = 5;
  rest.core_mean = {0.5, 0.5};
  detail::append_cpu(whole, 10, rest, 0.1);
  CHECK(whole.process_cpu_s == doctest::Approx(19.1));
  CHECK(whole.page_faults == 105);
  CHECK(whole.core_mean[0] == doctest::Approx((1.0 * 10 + 0.5 * 0.1) / 10.1));
  CHECK(whole.times_s == std::vector<double>{0.25, 0.5, 10.25, 10.5});
  CHECK(whole.cores[1].size() == 4);
}

TEST_CASE("Pipeline.Metrics.VerdictNamesASaturatedGraphThread") {
  // threads: 1, and three stages that take turns on it: none is saturated, the thread is.
  RunReport r;
  r.threads = 1;
  r.cores = 2;
  r.wall_s = 10;
  r.key_prefix = "phases.distill.";
  r.stages.resize(3);
  for (std::size_t i = 0; i < 3; ++i) {
    r.stages[i].name = "stage" + std::to_string(i);
    r.stages[i].busy_s = 3.2;
    r.stages[i].busy_fraction = 0.32;
  }
  CHECK(r.verdict() ==
        "the 1 graph thread is the bottleneck: busy 96% of the run with the stages' work together "
        "(the busiest, 'stage0', 32% of its 1 worker): the stages wait for a thread, not for each "
        "other: raise phases.distill.threads (now 1) within the cores, or make the stages cheaper");
  for (StageReport& stage : r.stages) stage.busy_s = 2;  // 60%: the run is short, or waits
  CHECK(r.verdict().rfind("no stage is saturated", 0) == 0);
}

TEST_CASE("Pipeline.Metrics.VerdictNamesAWaitOutsideTheGraph") {
  // A sink that hands batches to a Python loop, busy because it waits for room: the loop sets
  // the pace, and no param of the graph is advised. A smaller wait is plain work.
  RunReport r;
  r.threads = r.cores = 2;
  r.wall_s = 10;
  r.stages.resize(2);
  r.stages[0].name = "collate";
  r.stages[0].busy_s = 1;
  r.stages[0].busy_fraction = 0.05;
  r.stages[1].name = "python";
  r.stages[1].max_concurrency = kSerial;
  r.stages[1].busy_s = 9.9;
  r.stages[1].busy_fraction = 0.99;
  r.stages[1].waiting = {.seconds = 9.7, .what = "the Python loop to take its batches",
                         .held_after = false};
  CHECK(r.verdict() ==
        "the graph waits for the Python loop to take its batches: 'python' spent 98% of its time "
        "waiting for them; the graph is not what holds the run back");
  r.stages[1].waiting.seconds = 2;
  CHECK(r.verdict() ==
        "'python' is the bottleneck: busy 99% of its 1 worker; it runs serially by design: make "
        "each item cheaper");
}

TEST_CASE("Pipeline.Metrics.VerdictOnATrainingStepAdvisesNoUnmeasuredSplit") {
  RunReport r;
  r.threads = r.cores = 2;
  r.peak_threads = 2;
  r.wall_s = 10;
  r.stages.resize(3);
  r.stages[0].name = "decode";
  r.stages[0].workers = 2;
  r.stages[0].busy_s = 4;
  r.stages[0].busy_fraction = 0.2;
  r.stages[1].name = "teacher_infer";
  r.stages[1].intra_op_parallel = true;
  r.stages[2].name = "student";
  r.stages[2].max_concurrency = kSerial;
  r.stages[2].intra_op_parallel = true;
  r.stages[2].busy_s = 9;
  r.stages[2].busy_fraction = 0.9;
  const std::string verdict = r.verdict();
  CHECK(verdict.rfind("'student' is the bottleneck: busy 90% of its 1 worker; it runs serially by "
                      "design on 1 intra-op thread (2 cores: 2 graph threads; ",
                      0) == 0);
  CHECK(verdict.find("measure other splits of the cores between its "
                     "stages.student.params.intraop_threads, the graph threads that feed it and "
                     "the other model stages' concurrency (autotune: true tries them") !=
        std::string::npos);
  CHECK(verdict.find("fewer graph threads") == std::string::npos);
  CHECK(verdict.find("more intraop_threads") == std::string::npos);
  // After autotune, which tried layouts on the run's own work but rehearsed no intra-op
  // threads (several ranks), it asks for those to be timed by hand.
  r.autotune = AutotuneReport{};
  r.autotune->trials.push_back({.change = "start"});
  CHECK(r.verdict().find("autotune kept the fastest layout it tried but did not rehearse its "
                         "intra-op threads") != std::string::npos);
  // After autotune's rehearsals measured the intra-op threads, it says so and advises no split.
  r.autotune->trials.push_back({.change = "rehearsal", .rehearsal = true});
  CHECK(r.verdict().find(": autotune measured its intra-op threads on rehearsals and chose these; "
                         "make each item cheaper, or give the run more cores") !=
        std::string::npos);
  CHECK(r.verdict().find("measure other splits") == std::string::npos);
  // A serial stage without intra-op threads is told to be cheaper, not to split its work.
  r.stages[2].intra_op_parallel = false;
  CHECK(r.verdict().find("; it runs serially by design: make each item cheaper") !=
        std::string::npos);
  CHECK(r.verdict().find("split its work") == std::string::npos);
}

TEST_CASE("Pipeline.Metrics.VerdictGivesModelsTheirShareOfTheMatrixRate") {
  RunReport r;
  r.threads = r.cores = 2;
  r.stages.resize(3);
  r.stages[0].name = "teacher";
  r.stages[0].results = {{"gflops", 126.4}, {"matrix_rate_gflops", 316}};
  r.stages[1].name = "student";
  r.stages[1].busy_s = 1;
  r.stages[1].busy_fraction = 0.95;
  r.stages[1].results = {{"matrix_rate_gflops", 316}, {"loss", 2}, {"gflops", 173.8}};
  r.stages[2].name = "eval";  // a rate without a ceiling (a GPU), or none: not named
  r.stages[2].results = {{"gflops", 50}};
  const std::string verdict = r.verdict();
  CHECK(verdict.rfind("'student' is the bottleneck", 0) == 0);
  CHECK(verdict.find("; models against this CPU's measured matrix product rate: 'teacher' at 40% "
                     "(126 of 316 GFLOP/s), 'student' at 55% (174 of 316 GFLOP/s)") !=
        std::string::npos);
  CHECK(verdict.find("'eval' at") == std::string::npos);
  r.stages[0].results.clear();
  r.stages[1].results.clear();
  CHECK(r.verdict().find("matrix product rate") == std::string::npos);
}

namespace {
// A map whose time goes to waiting for a resource of its own (as a batcher waits for a free
// buffer that the items after it hold), which it reports.
class WaitingMap final : public Map<std::uint64_t, std::uint64_t> {
 public:
  StageWait waiting() const override {
    return {static_cast<double>(items_.load()) * 500e-6, "a free widget", "widgets", 2};
  }

 protected:
  std::optional<std::uint64_t> process(std::uint64_t&& v, ItemContext&) override {
    sleep_us(500);
    items_.fetch_add(1);
    return v;
  }

 private:
  std::atomic<std::uint64_t> items_{0};
};
}  // namespace

// Time a stage spends waiting for its own resource is not work: the verdict says what to raise.
TEST_CASE("Pipeline.Metrics.VerdictTellsWaitingFromWork" * doctest::timeout(60)) {
  Pipeline p;
  p.add("source", std::make_unique<CountSource<>>(300));
  p.add("batcher", std::make_unique<WaitingMap>());
  p.add("sink", null_sink());
  const RunReport r = p.run({.threads = 2, .key_prefix = "phases.main."});
  REQUIRE(r.bottleneck().has_value());
  CHECK(r.stages[1].waiting.seconds == doctest::Approx(0.15));
  const std::string verdict = r.verdict();
  CHECK(verdict.rfind("'batcher' is the bottleneck: busy ", 0) == 0);
  CHECK(verdict.find("of that waiting for a free widget, which the items after it hold: raise "
                     "phases.main.stages.batcher.params.widgets (now 2), or lower the queue "
                     "capacities after it") != std::string::npos);
  // Waiting that is a small share of the busy time leaves the usual advice.
  RunReport working = r;
  working.stages[1].waiting.seconds = 0.2 * working.stages[1].busy_s;
  CHECK(working.verdict().find("waiting for") == std::string::npos);
  // A wait on its peers, with its entry's param (a pipeline partition's node): no queue to
  // lower, and the key is the entry's.
  RunReport peers = r;
  peers.stages[1].name = "student/partition1";
  peers.stages[1].waiting.what = "the other partitions' tensors";
  peers.stages[1].waiting.param = "microbatches";
  peers.stages[1].waiting.held_after = false;
  peers.stages[1].waiting.entry_param = true;
  CHECK(peers.verdict().find("of that waiting for the other partitions' tensors: raise "
                             "phases.main.stages.student.params.microbatches (now 2)") !=
        std::string::npos);
  CHECK(peers.verdict().find("queue capacities") == std::string::npos);
  // A smaller wait on peers still names what shrinks it, in place of the thread advice.
  RunReport some = peers;
  some.stages[1].waiting.seconds = 0.2 * some.stages[1].busy_s;
  CHECK(some.verdict().find(", 20% of that waiting for the other partitions' tensors: make each "
                            "item cheaper, or raise phases.main.stages.student.params."
                            "microbatches (now 2) to shrink the wait") != std::string::npos);
  // The report file keeps both flags.
  const RunReport read = report_from_yaml(report_to_yaml(peers), "peers.yaml");
  CHECK_FALSE(read.stages[1].waiting.held_after);
  CHECK(read.stages[1].waiting.entry_param);
  CHECK(read.verdict() == peers.verdict());
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

TEST_CASE("Pipeline.Trace.UnwritablePathFailsBeforeTheRun" * doctest::timeout(60)) {
  // It was found when the trace was written, after the whole run.
  const std::string path = "no_such_folder/pipeline_test.trace.json";
  std::atomic<int> seen{0};
  Pipeline p;
  p.add("source", std::make_unique<CountSource<>>(50));
  p.add("sink", std::make_unique<ProbeSink<>>([&](std::uint64_t&&, ItemContext&) { ++seen; }));
  CHECK_THROWS_WITH_AS(
      p.run({.threads = 2, .trace_path = path}),
      ("cannot write " + path + ": cannot create " + path + ".tmp (No such file or directory)")
          .c_str(),
      Error);
  CHECK(seen == 0);
}

// A chart of the last item's spans: one row per track, labels padded with '=', '.' idle, and
// the idle share (a pipeline's bubble) in the header; earlier items are not drawn.
TEST_CASE("Pipeline.Report.TimelineChartOfTheLastItem") {
  StageReport stage;
  stage.name = "student";
  CHECK(format_timeline(stage).empty());
  stage.timeline = {{"partition 0", "F0", 1, 0.0, 1.0},   // an earlier item: not drawn
                    {"partition 0", "F0", 2, 10.0, 11.0},
                    {"partition 1", "F0", 2, 11.0, 12.0},
                    {"partition 1", "B0", 2, 12.0, 14.0},
                    {"partition 0", "B0", 2, 14.0, 16.0}};
  // 6 s drawn over 12 columns; 6 of 12 partition-seconds busy.
  CHECK(format_timeline(stage, 12) ==
        "'student' timeline of item 2 (6.000 s, 50% idle):\n"
        "  partition 0  F0......B0==\n"
        "  partition 1  ..F0B0==....\n");
}

TEST_CASE("Pipeline.Add.RejectsBadLinks") {
  SUBCASE("type mismatch") {
    Pipeline p;
    p.add("source", std::make_unique<CountSource<>>(1));
    p.add("sink", std::make_unique<ProbeSink<std::string>>([](std::string&&, ItemContext&) {}));
    CHECK_THROWS_WITH_AS(
        p.check(),
        "item type mismatch: 'sink' takes std::string, but 'source' emits unsigned long", Error);
  }
  SUBCASE("first stage not a source") {
    Pipeline p;
    p.add("m", identity_map());
    CHECK_THROWS_WITH_AS(p.check(), "the first stage 'm' must be a source, not a map", Error);
  }
  SUBCASE("flat map is serial") {
    Pipeline p;
    p.add("source", std::make_unique<CountSource<>>(1));
    CHECK_THROWS_WITH_AS(
        p.add<stages::BatchStage>("batch", {}, {.concurrency = 2}),
        "stage 'batch': concurrency 2 is not allowed: a flat map runs serially", Error);
  }
  SUBCASE("queue smaller than the producer's concurrency") {
    Pipeline p;
    p.add("source", std::make_unique<CountSource<>>(1));
    p.add("m", identity_map(), {.concurrency = 4});
    p.add("sink", null_sink(), {.queue_capacity = 2});
    CHECK_THROWS_WITH_AS(p.check(),
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

namespace {

// Emits 0 .. count-1 and plans that many, as a dataset source does.
class PlannedSource final : public Source<std::uint64_t> {
 public:
  explicit PlannedSource(std::uint64_t count) : count_(count) {}
  std::optional<std::uint64_t> plan(std::optional<std::uint64_t>) override { return count_; }

 protected:
  std::optional<std::uint64_t> next() override {
    return next_ < count_ ? std::optional(next_++) : std::nullopt;
  }

 private:
  std::uint64_t count_;
  std::uint64_t next_ = 0;
};

// A map that sleeps per item and shows how many items it finished as a live result.
class CountingMap final : public Map<std::uint64_t, std::uint64_t> {
 public:
  explicit CountingMap(std::int64_t sleep_micros) : sleep_micros_(sleep_micros) {}
  std::vector<StageResult> live_results() const override {
    return {{"done", static_cast<double>(done_.load())}};
  }

 protected:
  std::optional<std::uint64_t> process(std::uint64_t&& v, ItemContext&) override {
    sleep_us(sleep_micros_);
    done_.fetch_add(1);
    return v;
  }

 private:
  std::int64_t sleep_micros_;
  std::atomic<std::uint64_t> done_{0};
};

// A map that keeps its thread on the CPU for `cpu_ms` of thread time per item.
std::unique_ptr<Stage> spin_map(double cpu_ms) {
  return std::make_unique<ProbeMap<>>([cpu_ms](std::uint64_t&& v, ItemContext&) {
    auto thread_ms = [] {
      timespec t{};
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
      return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) / 1e6;
    };
    const double until = thread_ms() + cpu_ms;
    volatile std::uint64_t x = v;
    while (thread_ms() < until) x = x + 1;
    return std::optional<std::uint64_t>(v);
  });
}

// The CPU part of a report is internally consistent: a series per core, of equal lengths.
void check_cpu_shape(const CpuReport& cpu) {
  REQUIRE(!cpu.core_mean.empty());
  CHECK(cpu.cores.size() == cpu.core_mean.size());
  for (const std::vector<double>& core : cpu.cores) {
    CHECK(core.size() == cpu.times_s.size());
    for (const double v : core) CHECK((v >= 0.0 && v <= 1.0));
  }
  for (const double v : cpu.core_mean) CHECK((v >= 0.0 && v <= 1.0));
  for (std::size_t i = 1; i < cpu.times_s.size(); ++i) CHECK(cpu.times_s[i] > cpu.times_s[i - 1]);
  CHECK(cpu.interval_s == doctest::Approx(0.25));
}

}  // namespace

TEST_CASE("Pipeline.Progress.StagesExpectedAndLiveResults" * doctest::timeout(60)) {
  std::vector<Progress> seen;  // called from one background thread only
  Pipeline p;
  p.add("source", std::make_unique<PlannedSource>(300));
  p.add("count", std::make_unique<CountingMap>(1000), {.concurrency = 2});
  p.add("sink", null_sink());
  RunOptions options{.threads = 2};
  options.progress_interval_s = 0.02;
  options.on_progress = [&](const Progress& pr) { seen.push_back(pr); };
  p.run(options);

  REQUIRE(seen.size() >= 3);
  for (std::size_t i = 0; i < seen.size(); ++i) {
    const Progress& pr = seen[i];
    CHECK(pr.expected == 300);
    REQUIRE(pr.stages.size() == 3);
    CHECK(pr.stages[0].name == "source");
    CHECK(pr.stages[1].name == "count");
    CHECK(pr.stages[2].name == "sink");
    for (const StageProgress& s : pr.stages) CHECK((s.busy_fraction >= 0 && s.busy_fraction <= 1));
    CHECK(pr.stages[0].live.empty());
    REQUIRE(pr.stages[1].live.size() == 1);
    CHECK(pr.stages[1].live[0].name == "done");
    CHECK(pr.stages[1].live[0].value <= 300);
    if (i > 0) CHECK(pr.stages[1].live[0].value >= seen[i - 1].stages[1].live[0].value);
  }
  CHECK(seen.back().stages[1].live[0].value > seen.front().stages[1].live[0].value);
  // The sleeping map keeps both its workers busy most of the time.
  CHECK(seen.back().stages[1].busy_fraction > 0.3);
}

TEST_CASE("Pipeline.Progress.ExpectedUnknownIsZero" * doctest::timeout(60)) {
  std::vector<Progress> seen;
  Pipeline p;
  p.add("source", std::make_unique<CountSource<>>(100));  // plans nothing
  p.add("work", identity_map(1000), {.concurrency = 2});
  p.add("sink", null_sink());
  RunOptions options{.threads = 2};
  options.progress_interval_s = 0.01;
  options.on_progress = [&](const Progress& pr) { seen.push_back(pr); };
  p.run(options);
  REQUIRE(!seen.empty());
  CHECK(seen.back().expected == 0);
  CHECK(seen.back().stages.size() == 3);
}

TEST_CASE("Pipeline.Cpu.BusyCoresAndProcessTime" * doctest::timeout(60)) {
  if (!detail::read_core_ticks()) return;  // no /proc/stat: the report stays empty (tested below)
  // 40 items of 25 ms CPU each on two workers: ~1 CPU-s, ~0.5 s of wall on two free cores.
  Pipeline p;
  p.add("source", std::make_unique<CountSource<>>(40));
  p.add("spin", spin_map(25), {.concurrency = 2});
  p.add("sink", null_sink());
  const RunReport r = p.run({.threads = 2});

  check_cpu_shape(r.cpu);
  CHECK(r.cpu.times_s.size() >= 1);
  // This process alone kept the CPUs busy for a whole CPU-second...
  CHECK(r.cpu.process_cpu_s > 0.9);
  CHECK(r.cpu.process_cpu_s < 2.0 * r.wall_s + 0.5);
  // ... so the cores together were busy at least that much of the wall time (ticks are 10 ms).
  double summed = 0;
  for (const double v : r.cpu.core_mean) summed += v;
  CHECK(summed > 0.8 * r.cpu.process_cpu_s / r.wall_s);
  const std::string text = format_report(r);
  CHECK(text.find("\ncpu: core 0 ") != std::string::npos);
  CHECK(text.find(" page faults a second)\n") != std::string::npos);
}

TEST_CASE("Pipeline.Cpu.PageFaultsOfTheRun" * doctest::timeout(60)) {
  if (!detail::read_core_ticks()) return;
  // Each item maps 4 MB, writes it and unmaps it: 1,024 pages faulted in an item.
  Pipeline p;
  p.add("source", std::make_unique<CountSource<>>(10));
  p.add("touch", std::make_unique<ProbeMap<>>([](std::uint64_t&& v, ItemContext&) {
          constexpr std::size_t kBytes = 4 << 20;
          void* m = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                         -1, 0);
          REQUIRE(m != MAP_FAILED);
          std::memset(m, 1, kBytes);
          munmap(m, kBytes);
          return std::optional<std::uint64_t>(v);
        }));
  p.add("sink", null_sink());
  const RunReport r = p.run({.threads = 1});
  CHECK(r.cpu.page_faults >= 10 * 1024);
  CHECK(r.cpu.page_faults < 10 * 1024 + 5000);  // the run's own, not the process's so far
}

TEST_CASE("Pipeline.Cpu.ShortRunStillHasMeans" * doctest::timeout(60)) {
  if (!detail::read_core_ticks()) return;
  Pipeline p;
  p.add("source", std::make_unique<CountSource<>>(5));
  p.add("sink", null_sink());
  const RunReport r = p.run({.threads = 1});
  check_cpu_shape(r.cpu);
  CHECK(r.cpu.times_s.empty());  // shorter than one interval: no sample, only the means
  CHECK(r.cpu.process_cpu_s >= 0);
}

TEST_CASE("Pipeline.Cpu.RecorderSeriesCappedAndUnreadableIsEmpty") {
  const auto dir = std::filesystem::temp_directory_path() / "flowtrain_cpu_test";
  std::filesystem::create_directories(dir);
  const std::string stat = (dir / "stat").string();
  // Core 0 is busy one tick in two, core 1 never; the summary line 'cpu' is not a core.
  auto write_stat = [&](std::uint64_t step) {
    std::ofstream(stat) << "cpu  9 9 9 9 9 9 9 9 0 0\n"
                        << "cpu0 " << step << " 0 0 " << step << " 0 0 0 0 0 0\n"
                        << "cpu1 0 0 0 " << 2 * step << " 0 0 0 0 0 0\n"
                        << "intr 1 2 3\n";
  };
  write_stat(0);
  const auto start = detail::Clock::now();
  const auto interval = std::chrono::milliseconds(1);
  detail::CpuRecorder cpu(start, interval, stat);
  constexpr std::uint64_t kSamples = 3000;
  for (std::uint64_t i = 1; i <= kSamples; ++i) {
    write_stat(i);
    cpu.poll(start + i * interval);
  }
  const CpuReport report = cpu.finish();
  REQUIRE(report.core_mean.size() == 2);
  CHECK(report.core_mean[0] == doctest::Approx(0.5));
  CHECK(report.core_mean[1] == 0.0);
  REQUIRE(report.cores.size() == 2);
  // Averaged down as it grew, like the queue series: at most ~2 x 512 points, all consistent.
  CHECK(report.times_s.size() >= 512);
  CHECK(report.times_s.size() < 1024);
  CHECK(report.cores[0].size() == report.times_s.size());
  CHECK(report.cores[1].size() == report.times_s.size());
  CHECK(report.cores[0].front() == doctest::Approx(0.5));
  CHECK(report.cores[0].back() == doctest::Approx(0.5));
  CHECK(report.cores[1].back() == 0.0);
  CHECK(report.times_s.back() <= kSamples * 1e-3 + 1e-9);
  CHECK(report.interval_s == doctest::Approx(1e-3));

  detail::CpuRecorder missing(start, interval, (dir / "no_such_stat").string());
  missing.poll(start + 10 * interval);
  const CpuReport empty = missing.finish();
  CHECK(empty.core_mean.empty());
  CHECK(empty.cores.empty());
  CHECK(empty.times_s.empty());
  CHECK(empty.process_cpu_s == 0.0);
  RunReport r;
  r.wall_s = 1;
  r.cpu = empty;
  CHECK(format_report(r).find("cpu:") == std::string::npos);
  std::filesystem::remove_all(dir);
}
