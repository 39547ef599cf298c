// Assembling a graph in C++: typed options, typed handles, connect, lambdas as stages.

#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

#include "graph/error.hpp"
#include "graph/pipeline.hpp"
#include "graph/registry.hpp"
#include "stages/util/batch.hpp"
#include "stages/util/sequence.hpp"
#include "stages/util/spin.hpp"

using namespace flowtrain;

namespace {

// Adds the two parts of each item (a join pairs them by sequence number).
class Add final : public Join<std::uint64_t, std::uint64_t> {
 protected:
  std::optional<std::uint64_t> process(std::vector<std::uint64_t>&& parts,
                                       ItemContext&) override {
    return parts[0] + parts[1];
  }
};

}  // namespace

TEST_CASE("Pipeline.Api.ConnectBuildsFanOutAndJoin" * doctest::timeout(60)) {
  Pipeline p;
  auto numbers = p.add<stages::SequenceSource>("numbers", {.count = 1000, .start = 1});
  auto square = p.add("square", [](std::uint64_t n) { return n * n; }, {.concurrency = 2});
  auto twice = p.add("twice", [](std::uint64_t n) { return 2 * n; });
  auto add = p.add("add", std::make_unique<Add>());
  std::vector<std::uint64_t> seen;
  auto keep = p.add("keep", [&](std::uint64_t v) { seen.push_back(v); }, {.ordered = true});
  p.connect(numbers, square).connect(numbers, twice).connect(square, add).connect(twice, add);
  p.connect(add, keep);
  CHECK(graph_text(p.decls()).find("<- square, twice") != std::string::npos);

  const RunReport report = p.run({.threads = 2});
  REQUIRE(seen.size() == 1000);
  for (std::uint64_t n = 1; n <= 1000; ++n) CHECK(seen[n - 1] == n * n + 2 * n);
  CHECK(report.stages.size() == 5);
}

TEST_CASE("Pipeline.Api.HandlesChainTopToBottom" * doctest::timeout(60)) {
  // Without connect, each stage takes the one added before it.
  Pipeline p;
  std::uint64_t sum = 0;
  p.add<stages::SequenceSource>("numbers", {.count = 100})
      .add<stages::SpinStage>("spin", {.rounds = 0}, {.concurrency = 2})
      .add("sum", [&](std::uint64_t v) { sum += v; });
  p.run({.threads = 2});
  CHECK(sum == 99 * 100 / 2);
}

TEST_CASE("Pipeline.Api.LambdaSourceAndDroppingMap" * doctest::timeout(60)) {
  Pipeline p;
  int next = 0;
  p.add("count", [&]() -> std::optional<int> {
    if (next == 10) return std::nullopt;
    return next++;
  });
  p.add("odd", [](int v) -> std::optional<int> {
    if (v % 2 == 0) return std::nullopt;
    return v;
  });
  std::vector<int> kept;
  p.add("keep", [&](int v) { kept.push_back(v); }, {.ordered = true});
  const RunReport report = p.run({.threads = 2});
  CHECK(kept == std::vector<int>{1, 3, 5, 7, 9});
  CHECK(report.stages[1].dropped == 5);
  REQUIRE(!report.stages[1].drops.empty());
  CHECK(report.stages[1].drops[0].reason == "dropped by a lambda");
}

TEST_CASE("Pipeline.Api.TypedOptionsAreCheckedLikeAConfig") {
  Pipeline p;
  CHECK_THROWS_WITH_AS(p.add<stages::SpinStage>("spin", {.rounds = -5}),
                       "stage 'spin': param 'rounds' must be >= 0, got -5", Error);
  CHECK_THROWS_WITH_AS(p.add<stages::BatchStage>("batch", {.size = 1 << 21}),
                       "stage 'batch': param 'size' must be <= 1048576, got 2097152", Error);
  CHECK_THROWS_WITH_AS(p.add<stages::BatchStage>("batch", {}, {.concurrency = 2}),
                       "stage 'batch': concurrency 2 is not allowed: a flat map runs serially",
                       Error);
}

TEST_CASE("Pipeline.Api.OptionsAreTheRegisteredParams") {
  // One declaration: the registry's params are the options struct's fields, defaults included,
  // and params read back into the struct give the values set.
  const StageInfo* spin = Registry::global().find("spin");
  REQUIRE(spin != nullptr);
  const std::vector<ParamSpec> specs = option_specs<stages::SpinStage::Options>();
  REQUIRE(spin->doc.params.size() == specs.size());
  CHECK(spin->doc.params[0].name == "rounds");
  CHECK(spin->doc.params[0].default_text() == "20000");
  CHECK(spin->doc.params[0].min == 0);

  const Params params = to_params(stages::BatchStage::Options{.size = 7, .drop_last = true});
  CHECK(params.get_int("size") == 7);
  CHECK(params.get_bool("drop_last"));
  const auto back = options_from<stages::BatchStage::Options>(params);
  CHECK(back.size == 7);
  CHECK(back.drop_last);
}

TEST_CASE("Pipeline.Api.ConnectChecksWhenComplete") {
  Pipeline p;
  auto numbers = p.add<stages::SequenceSource>("numbers", {.count = 10});
  auto words = p.add("words", [](std::string s) { return s.size(); });
  auto sink = p.add("sink", [](std::size_t) {});
  p.connect(words, sink);
  (void)numbers;  // `p.connect(numbers, words)` does not compile: unsigned long is no string
  // `words` still takes the stage before it, `numbers`: the run refuses the graph first.
  CHECK_THROWS_WITH_AS(p.run(),
                       "item type mismatch: 'words' takes std::string, but 'numbers' emits "
                       "unsigned long",
                       Error);
}
