// Paused runs that continue with another layout, and autotune, which is made of them.
#include <doctest/doctest.h>
#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <thread>

#include "graph/autotune.hpp"
#include "graph/config.hpp"
#include "graph/error.hpp"
#include "graph/pipeline.hpp"
#include "stages/util/batch.hpp"
#include "tests/test_stages.hpp"

using namespace flowtrain;
using namespace flowtrain::testing;

namespace {

// Adds its parts.
class SumJoin final : public Join<std::uint64_t, std::uint64_t> {
 protected:
  std::optional<std::uint64_t> process(std::vector<std::uint64_t>&& parts, ItemContext&) override {
    return std::accumulate(parts.begin(), parts.end(), std::uint64_t{0});
  }
};

// source -> scramble (drops multiples of 97) -+-> join -> batch (10) -> sink
//                    -> double ---------------+
// `pause_at`: the scramble stage asks for a pause when it sees these values. Returns the
// batches and the reports of every run; between runs the concurrency and threads change.
struct PausedRuns {
  std::vector<std::vector<std::uint64_t>> batches;
  std::vector<RunReport> reports;
};

PausedRuns run_with_pauses(const std::vector<std::uint64_t>& pause_at) {
  PausedRuns out;
  Pipeline p;
  const auto jitter = [](std::uint64_t v) {
    sleep_us(static_cast<std::int64_t>((v * 7919) % 40));
  };
  p.add("source", std::make_unique<CountSource<>>(2005));
  p.add("scramble", std::make_unique<ProbeMap<>>([&, jitter](std::uint64_t&& v, ItemContext& ctx)
                                                     -> std::optional<std::uint64_t> {
          jitter(v);
          if (std::find(pause_at.begin(), pause_at.end(), v) != pause_at.end()) p.request_pause();
          if (v % 97 == 0) return ctx.drop("multiple of 97: " + std::to_string(v));
          return v;
        }),
        {.concurrency = 1, .queue_capacity = 8});
  p.add("double", std::make_unique<ProbeMap<>>([jitter](std::uint64_t&& v, ItemContext&) {
          jitter(v + 1);
          return std::optional<std::uint64_t>(2 * v);
        }),
        {.concurrency = 1, .queue_capacity = 8, .inputs = {"source"}});
  p.add("join", std::make_unique<SumJoin>(), {.queue_capacity = 8, .inputs = {"scramble", "double"}});
  p.add<stages::BatchStage>("batch", {.size = 10}, {.queue_capacity = 8});
  p.add("sink",
        std::make_unique<ProbeSink<std::vector<std::uint64_t>>>(
            [&](std::vector<std::uint64_t>&& b, ItemContext&) { out.batches.push_back(b); }),
        {.queue_capacity = 4});
  const std::size_t layouts[][2] = {{1, 1}, {3, 4}, {2, 2}, {4, 3}};  // concurrency, threads
  for (std::size_t run = 0;; ++run) {
    const auto [concurrency, threads] = layouts[run % 4];
    p.set_concurrency("scramble", concurrency);
    p.set_concurrency("double", concurrency);
    p.set_concurrency("join", concurrency);
    out.reports.push_back(p.run({.threads = threads, .cores = 16}));
    if (!out.reports.back().paused) break;
  }
  return out;
}

const StageReport& stage_of(const RunReport& r, const std::string& name) {
  for (const StageReport& s : r.stages) {
    if (s.name == name) return s;
  }
  throw Error("no stage " + name);
}

}  // namespace

TEST_CASE("Pipeline.Pause.ContinuesTheStreamWithAnotherLayout" * doctest::timeout(60)) {
  const PausedRuns once = run_with_pauses({});
  const PausedRuns paused = run_with_pauses({400, 1000, 1700});
  REQUIRE(once.reports.size() == 1);
  REQUIRE(paused.reports.size() == 4);
  for (std::size_t i = 0; i < 3; ++i) CHECK(paused.reports[i].paused);
  CHECK_FALSE(paused.reports.back().paused);
  CHECK_FALSE(paused.reports.back().stopped);

  // The same batches as one run: nothing lost or repeated at a pause, partial batches carried
  // over, the join paired by item across runs.
  CHECK(paused.batches == once.batches);
  std::uint64_t items = 0;
  for (const auto& b : once.batches) items += b.size();
  CHECK(items == 2005 - 21);  // 0, 97, ..., 1940 dropped
  CHECK(once.batches.front() == std::vector<std::uint64_t>{3, 6, 9, 12, 15, 18, 21, 24, 27, 30});

  // The last report counts every run: items, drops (listed with their item numbers, which
  // run on across the pauses) and wall time.
  const RunReport& last = paused.reports.back();
  CHECK(last.stages[0].items_out == 2005);
  const StageReport& scramble = stage_of(last, "scramble");
  CHECK(scramble.items_in == 2005);
  CHECK(scramble.dropped == 21);
  REQUIRE(scramble.drops.size() == 21);
  for (std::size_t k = 0; k < scramble.drops.size(); ++k) CHECK(scramble.drops[k].seq % 97 == 0);
  CHECK(stage_of(last, "sink").items_in == once.batches.size());
  CHECK(last.wall_s >= paused.reports[2].wall_s);
  // Each paused run stopped early: fewer items than the whole stream.
  CHECK(paused.reports[0].stages[0].items_out < 2005);
  CHECK(last.threads == 3);
}

TEST_CASE("Pipeline.Pause.OnlyBetweenRunsOfAPausedPipeline" * doctest::timeout(60)) {
  Pipeline p;
  p.add("source", std::make_unique<CountSource<>>(50));
  p.add("work", std::make_unique<ProbeMap<>>([](std::uint64_t&& v, ItemContext&) {
          return std::optional<std::uint64_t>(v);
        }));
  p.add("sink", std::make_unique<ProbeSink<>>([](std::uint64_t&&, ItemContext&) {}));
  CHECK_THROWS_WITH_AS(p.set_concurrency("nope", 2), "no stage 'nope' in this pipeline", Error);
  CHECK_THROWS_WITH_AS(p.set_concurrency("source", 2),
                       doctest::Contains("stage 'source'"), Error);
  CHECK_FALSE(p.set_threads_per_invocation("work", 2));  // a plain map keeps its one thread
  const RunReport r = p.run({.threads = 2});
  CHECK_FALSE(r.paused);
  CHECK(p.produced() == 50);
  CHECK_THROWS_WITH_AS(p.set_concurrency("work", 2),
                       "stage 'work': a pipeline that ran to its end cannot change its layout",
                       Error);
  CHECK_THROWS_WITH_AS(p.run(), "a pipeline runs once; build a new one to run again", Error);
}

// source -> slow (sleeps 2 ms an item: twice the workers, twice the rate) -> sink, started on
// one graph thread and concurrency 1, with 2 cores.
TEST_CASE("Autotune.RaisesTheSlowStagesConcurrencyWithinTheCores" * doctest::timeout(120)) {
  std::mutex mutex;
  std::vector<std::uint64_t> seen;
  Pipeline p;
  p.add("source", std::make_unique<CountSource<>>(4000));
  p.add("slow", std::make_unique<ProbeMap<>>([](std::uint64_t&& v, ItemContext&) {
          sleep_us(2000);
          return std::optional<std::uint64_t>(v);
        }),
        {.concurrency = 1, .queue_capacity = 1});
  p.add("sink", std::make_unique<ProbeSink<>>([&](std::uint64_t&& v, ItemContext&) {
          std::lock_guard lock(mutex);
          seen.push_back(v);
        }),
        {.queue_capacity = 1});
  RunOptions options{.threads = 1, .cores = 2, .key_prefix = "phases.x."};
  options.autotune = {.enabled = true, .warmup_s = 0.2, .trial_s = 0.6, .max_trials = 4};
  const RunReport r = autotune_run(p, options, p.decls());

  REQUIRE(r.autotune);
  const AutotuneReport& a = *r.autotune;
  REQUIRE(a.trials.size() >= 2);
  CHECK(a.trials[0].change == "start");
  CHECK(a.trials[0].kept);
  CHECK(a.trials[1].change == "'slow' concurrency 1 -> 2, graph threads 1 -> 2");
  CHECK(a.trials[1].kept);
  CHECK(a.trials[1].items_per_s > 1.5 * a.trials[0].items_per_s);
  // Nothing beyond the 2 cores was tried: 2 graph threads x 1 is the most.
  for (const AutotuneTrial& t : a.trials) CHECK(t.layout.find("3") == std::string::npos);
  CHECK(a.overrides == std::vector<std::string>{"phases.x.threads=2",
                                                "phases.x.stages.slow.concurrency=2",
                                                "phases.x.stages.sink.queue_capacity=2"});
  CHECK(autotune_yaml(a, "phases.x.") ==
        "# chosen by autotune for phases.x: set these keys (stages by name)\n"
        "threads: 2\n"
        "stages:\n"
        "  slow: {concurrency: 2}\n"
        "  sink: {queue_capacity: 2}\n");
  // The rest of the run used the chosen layout, and every item arrived once.
  CHECK_FALSE(r.paused);
  CHECK(r.threads == 2);
  CHECK(stage_of(r, "slow").workers == 2);
  std::sort(seen.begin(), seen.end());
  std::vector<std::uint64_t> expected(4000);
  std::iota(expected.begin(), expected.end(), 0);
  CHECK(seen == expected);
  const std::string text = format_report(r);
  CHECK(text.find("autotune: " + std::to_string(a.trials.size()) + " trial(s)") != std::string::npos);
  CHECK(text.find("settings: phases.x.threads=2 phases.x.stages.slow.concurrency=2") !=
        std::string::npos);
}

// A stage whose workers finish out of order waits on its ordered consumer's full queue; a deeper
// queue lets its fast items through while a slow one is computed. Items of 2 MB: the memory a
// deeper queue holds counts against `memory_mb` (kept in malloc's heap, not returned to the
// system between items, so the resident memory's high-water mark is what the queues held).
TEST_CASE("Autotune.DeepensTheQueueOfAnOrderedConsumerWithinTheMemoryBudget" *
          doctest::timeout(120)) {
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  const auto tune = [](double memory_mb) {
    Pipeline p;
    p.add("source", std::make_unique<CountSource<>>(3000));
    using Block = std::shared_ptr<char[]>;
    p.add("uneven", std::make_unique<ProbeMap<std::uint64_t, Block>>(
                        [](std::uint64_t&& v, ItemContext&) {
                          sleep_us(v % 8 == 0 ? 4000 : 400);  // every 8th is slow
                          // 2 MB, resident: one byte written per page (cheap under sanitizers).
                          constexpr std::size_t kBytes = 2 << 20;
                          Block block(new char[kBytes]);
                          for (std::size_t i = 0; i < kBytes; i += 4096) {
                            block[i] = static_cast<char>(v);
                          }
                          return std::optional<Block>(std::move(block));
                        }),
          {.concurrency = 2, .queue_capacity = 2});
    p.add("sink", std::make_unique<ProbeSink<Block>>([](Block&&, ItemContext&) {}),
          {.queue_capacity = 2, .ordered = true});
    RunOptions options{.threads = 2, .cores = 2};
    options.autotune = {.enabled = true, .warmup_s = 0.2, .trial_s = 0.6, .max_trials = 2,
                        .memory_mb = memory_mb};
    return *autotune_run(p, options, p.decls()).autotune;
  };
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // Their allocators keep freed memory (a quarantine) and slow every item down: only the
  // candidate itself is checked there.
  const AutotuneReport sanitized = tune(1e6);
  REQUIRE(sanitized.trials.size() == 2);
  CHECK(sanitized.trials[1].change == "'sink' queue 2 -> 8");
#else
  // Six more items of 2 MB in flight do not fit 16 MB more than before the first trial (tuned
  // first: the heap keeps its high-water mark).
  const AutotuneReport tight = tune(16);
  MESSAGE(format_autotune(tight));
  REQUIRE(tight.trials.size() == 2);
  CHECK(tight.trials[1].change.rfind("'sink' queue 2 -> 8 (memory +", 0) == 0);
  CHECK_FALSE(tight.trials[1].kept);
  CHECK(tight.overrides.empty());
  const AutotuneReport roomy = tune(512);
  MESSAGE(format_autotune(roomy));
  REQUIRE(roomy.trials.size() == 2);
  CHECK(roomy.trials[1].change == "'sink' queue 2 -> 8");
  CHECK(roomy.trials[1].kept);
  CHECK(roomy.trials[1].items_per_s > 1.15 * roomy.trials[0].items_per_s);
  CHECK(roomy.overrides == std::vector<std::string>{"stages.sink.queue_capacity=8"});
#endif
  mallopt(M_MMAP_THRESHOLD, 128 << 10);
}

// A model's first calls are slow (a TorchScript module profiles its first runs): a trial's
// window starts after its warm-up and two completions, so they do not count against a layout.
TEST_CASE("Autotune.TheWindowStartsAfterTwoCompletions" * doctest::timeout(60)) {
  std::atomic<int> calls{0};
  Pipeline p;
  p.add("source", std::make_unique<CountSource<>>(1500));
  p.add("warming", std::make_unique<ProbeMap<>>([&](std::uint64_t&& v, ItemContext&) {
          const int call = calls++;
          sleep_us(call == 1 || call == 2 ? 1'000'000 : 2000);  // the 2nd and 3rd are slow
          return std::optional<std::uint64_t>(v);
        }),
        {.concurrency = 1, .queue_capacity = 1});
  p.add("sink", std::make_unique<ProbeSink<>>([](std::uint64_t&&, ItemContext&) {}),
        {.queue_capacity = 1});
  RunOptions options{.threads = 1, .cores = 1};
  options.autotune = {.enabled = true, .warmup_s = 0, .trial_s = 0.5, .max_trials = 1};
  const RunReport r = autotune_run(p, options, p.decls());

  REQUIRE(r.autotune);
  REQUIRE(r.autotune->trials.size() == 1);
  // 2 ms an item is 500 items/s (about 300 on a loaded machine); a window with the 3rd item's
  // 1 s in it would measure under 50.
  CHECK(r.autotune->trials[0].items_per_s > 100);
  CHECK(r.stages[2].items_in == 1500);
}

TEST_CASE("Autotune.OffRunsAsConfigured" * doctest::timeout(60)) {
  Pipeline p;
  p.add("source", std::make_unique<CountSource<>>(100));
  p.add("sink", std::make_unique<ProbeSink<>>([](std::uint64_t&&, ItemContext&) {}));
  const RunReport r = autotune_run(p, {.threads = 1}, p.decls());
  CHECK_FALSE(r.autotune);
  CHECK(r.stages[1].items_in == 100);
}
