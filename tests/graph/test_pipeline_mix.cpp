// The built-in `mix`: several sources interleaved with weights, the same order on every run.

#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "graph/config.hpp"
#include "graph/error.hpp"
#include "graph/mix.hpp"
#include "graph/pipeline.hpp"
#include "tests/test_stages.hpp"

using namespace flowtrain;
using namespace flowtrain::testing;

namespace {

// The integers first, first+1, ..., first+count-1; can resume (seek) and knows its size.
// `shared`: it also takes a shared position, as a source whose order data-parallel ranks share
// (here: the integer to go on from).
class Range final : public Source<std::uint64_t> {
 public:
  Range(std::uint64_t first, std::uint64_t count, bool shared = false)
      : next_(first), end_(first + count), shared_(shared) {}
  std::optional<std::uint64_t> plan(std::optional<std::uint64_t>) override { return end_ - next_; }
  bool seek(std::uint64_t position) override {
    next_ += position;
    return next_ <= end_;
  }
  bool seek_shared(std::uint64_t position) override {
    if (!shared_ || position > end_) return false;
    next_ = position;
    return true;
  }

 protected:
  std::optional<std::uint64_t> next() override {
    if (next_ == end_) return std::nullopt;
    return next_++;
  }

 private:
  std::uint64_t next_;
  std::uint64_t end_;
  bool shared_;
};

// A sink that keeps what it gets in order and may ask the run to resume at `resume_at`.
class Keep final : public SerialSink<std::uint64_t> {
 public:
  explicit Keep(std::vector<std::uint64_t>& out, std::optional<ResumePosition> resume_at = {})
      : out_(out), resume_at_(resume_at) {}
  std::optional<ResumePosition> resume_position() const override { return resume_at_; }

 protected:
  void consume(std::uint64_t&& v, ItemContext&) override { out_.push_back(v); }

 private:
  std::vector<std::uint64_t>& out_;
  std::optional<ResumePosition> resume_at_;
};

// Food (0..999) and extra (100000..100299) mixed 3:1, through a map of `concurrency` workers.
std::vector<std::uint64_t> mixed(std::size_t threads,
                                 std::size_t concurrency,
                                 MixOptions options = {.weights = {3, 1}, .seed = 7},
                                 std::optional<ResumePosition> resume_at = {}) {
  std::vector<std::uint64_t> out;
  Pipeline p;
  auto food = p.add("food", std::make_unique<Range>(0, 1000));
  auto extra = p.add("extra", std::make_unique<Range>(100000, 300));
  auto mix = p.add<MixStage>("mix", options);
  p.connect(food, mix).connect(extra, mix);
  p.add("slow", std::make_unique<ProbeMap<>>([](std::uint64_t&& v, ItemContext&) {
          sleep_us(static_cast<std::int64_t>(v % 5) * 20);
          return std::optional<std::uint64_t>(v);
        }),
        {.concurrency = concurrency, .queue_capacity = 8});
  p.add("keep", std::make_unique<Keep>(out, resume_at));
  p.run({.threads = threads});
  return out;
}

std::size_t count_extra(const std::vector<std::uint64_t>& items, std::size_t first_n) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < first_n && i < items.size(); ++i) n += items[i] >= 100000 ? 1 : 0;
  return n;
}

}  // namespace

TEST_CASE("Pipeline.Mix.WeightedOrderIsTheSameOnEveryRun" * doctest::timeout(60)) {
  const std::vector<std::uint64_t> a = mixed(1, 1);
  const std::vector<std::uint64_t> b = mixed(2, 4);
  CHECK(a == b);
  // Nothing lost: every item of both sources, each source's items in their own order.
  REQUIRE(a.size() == 1300);
  std::uint64_t next_food = 0, next_extra = 100000;
  for (const std::uint64_t v : a) CHECK(v == (v >= 100000 ? next_extra++ : next_food++));
  // 3:1 while both last: about a quarter of the first 800 from `extra`.
  const double share = static_cast<double>(count_extra(a, 800)) / 800;
  CHECK(share > 0.2);
  CHECK(share < 0.3);
  // Another seed, another order.
  CHECK(mixed(2, 2, {.weights = {3, 1}, .seed = 8}) != a);
}

TEST_CASE("Pipeline.Mix.StopOnFirstEmpty" * doctest::timeout(60)) {
  const std::vector<std::uint64_t> all = mixed(2, 2, {.weights = {1, 1}, .seed = 3});
  const std::vector<std::uint64_t> first =
      mixed(2, 2, {.weights = {1, 1}, .seed = 3, .stop_on_first_empty = true});
  CHECK(all.size() == 1300);
  // It ends when `extra` (300) runs out, about 600 items in; up to then it is the same order.
  CHECK(count_extra(first, first.size()) == 300);
  CHECK(first.size() < 700);
  CHECK(std::equal(first.begin(), first.end(), all.begin()));
}

TEST_CASE("Pipeline.Mix.ResumeContinuesTheSameOrder" * doctest::timeout(60)) {
  const std::vector<std::uint64_t> full = mixed(2, 2);
  // Past the end of `extra` too: the replay must find it exhausted where the run did.
  for (const std::uint64_t at : {std::uint64_t{1}, std::uint64_t{517}, std::uint64_t{1250}}) {
    const std::vector<std::uint64_t> rest =
        mixed(2, 2, {.weights = {3, 1}, .seed = 7}, ResumePosition{.items = at});
    REQUIRE(rest.size() == full.size() - at);
    CHECK(std::equal(rest.begin(), rest.end(), full.begin() + static_cast<std::ptrdiff_t>(at)));
  }
}

// A resume on another number of ranks than wrote the checkpoint (`resized`) can only start at
// the shared position: a source that takes one starts there (and does on the same ranks too);
// one that cannot, or a mix (whose inputs count per rank), is refused in one line.
TEST_CASE("Pipeline.Resume.AnotherNumberOfRanksStartsAtTheSharedPosition" * doctest::timeout(60)) {
  const auto run = [](bool shared_source, ResumePosition at) {
    std::vector<std::uint64_t> out;
    Pipeline p;
    p.add("numbers", std::make_unique<Range>(0, 100, shared_source));
    p.add("keep", std::make_unique<Keep>(out, at));
    p.run({.threads = 2});
    return out;
  };
  for (const bool resized : {false, true}) {
    const std::vector<std::uint64_t> out =
        run(true, {.items = 5, .shared = 40, .resized = resized});
    REQUIRE(out.size() == 60);
    CHECK(out.front() == 40);
  }
  // Without a shared position the source goes by the items, on the same ranks only.
  CHECK(run(false, {.items = 5, .shared = 40}).front() == 5);
  CHECK(run(true, {.items = 5}).front() == 5);
  CHECK_THROWS_WITH_AS(
      run(false, {.items = 5, .shared = 40, .resized = true}),
      "stage 'keep' resumes from source position 5 (written by another number of ranks), but "
      "source 'numbers' cannot reach its shared position 40; resume on the checkpoint's number "
      "of ranks or start without it",
      Error);
  CHECK_THROWS_WITH_AS(mixed(2, 2, {.weights = {3, 1}, .seed = 7},
                             ResumePosition{.items = 5, .shared = 40, .resized = true}),
                       "stage 'keep' resumes a checkpoint written by another number of ranks, "
                       "but mix 'mix' cannot: its order is counted per rank; resume on the "
                       "checkpoint's number of ranks or start without it",
                       Error);
}

TEST_CASE("Pipeline.Mix.ChecksItsInputs") {
  SUBCASE("a stage after two sources must be the mix") {
    Pipeline p;
    p.add("a", std::make_unique<Range>(0, 5));
    p.add("b", std::make_unique<Range>(0, 5));
    p.add("m", std::make_unique<ProbeMap<>>([](std::uint64_t&& v, ItemContext&) {
            return std::optional<std::uint64_t>(v);
          }));
    CHECK_THROWS_WITH_AS(p.check(),
                         "stage 'm' takes source 'b' directly, but the pipeline has 2 sources: a "
                         "mix takes them all",
                         Error);
  }
  SUBCASE("a mix takes sources only") {
    Pipeline p;
    p.add("a", std::make_unique<Range>(0, 5));
    p.add("m", std::make_unique<ProbeMap<>>([](std::uint64_t&& v, ItemContext&) {
            return std::optional<std::uint64_t>(v);
          }));
    p.add<MixStage>("mix", {}, {.inputs = {"a", "m"}});
    CHECK_THROWS_WITH_AS(p.check(), "mix 'mix' takes sources only, but its input 'm' is a map",
                         Error);
  }
  SUBCASE("sources come first") {
    Pipeline p;
    p.add("a", std::make_unique<Range>(0, 5));
    p.add("m", [](std::uint64_t v) { return v; });
    p.add("b", std::make_unique<Range>(0, 5));
    CHECK_THROWS_WITH_AS(p.check(),
                         "source 'b' must be the first stage (a pipeline has one source, or "
                         "several that one mix takes), but follows 'm'",
                         Error);
  }
  SUBCASE("one weight per input") {
    Pipeline p;
    p.add("a", std::make_unique<Range>(0, 5));
    p.add("b", std::make_unique<Range>(0, 5));
    p.add<MixStage>("mix", {.weights = {1, 2, 3}}, {.inputs = {"a", "b"}});
    p.add("sink", [](std::uint64_t) {});
    CHECK_THROWS_WITH_AS(p.run(),
                         "mix 'mix': param 'weights' has 3 values for 2 inputs; give one per "
                         "input, in their order",
                         Error);
  }
}

TEST_CASE("Pipeline.Mix.FromYamlAndInTheReport" * doctest::timeout(60)) {
  const PipelineConfig config = parse_pipeline_config(R"(
stages:
  - {name: food, type: sequence, params: {count: 3000}}
  - {name: extra, type: sequence, params: {count: 1000, start: 1000000}}
  - {name: data, type: mix, inputs: [food, extra], params: {weights: [0.75, 0.25], seed: 1}}
  - {name: spin, type: spin, concurrency: 2, params: {rounds: 10}}
  - {type: discard}
)",
                                                       "inline");
  CHECK(graph_text(stage_decls(config)).find("data") != std::string::npos);
  const RunReport report = build_pipeline(config)->run({.threads = 2});
  REQUIRE(report.stages.size() == 5);
  CHECK(report.stages[0].items_out == 3000);
  CHECK(report.stages[1].items_out == 1000);
  CHECK(report.stages[2].kind == StageShape::Kind::kMix);
  CHECK(report.stages[2].items_out == 4000);
  CHECK(report.stages[3].items_in == 4000);
  const std::string text = format_report(report);
  CHECK(text.find("data") != std::string::npos);
  CHECK(text.find("mix") != std::string::npos);
}
