#include <doctest/doctest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "graph/config.hpp"
#include "graph/error.hpp"
#include "tests/temp_dir.hpp"

using namespace flowtrain;

namespace {

// A source with a path parameter, registered in a test-local registry (so the global one, which
// docs/config.md mirrors, holds only built-in stages).
class LinesSource final : public Source<std::string> {
 public:
  explicit LinesSource(const Params& params) : path_(params.get_string("path")) {}
  static StageDoc describe() {
    return {"lines of a file",
            {path_param("path", "the file"),
             string_param("order", "forward", "reading order", {"forward", "backward"})}};
  }

 protected:
  std::optional<std::string> next() override { return std::nullopt; }

 private:
  std::string path_;
};

// A map whose invocations use `intraop_threads` threads, for the thread budget checks.
class HeavyMap final : public Map<std::uint64_t, std::uint64_t> {
 public:
  explicit HeavyMap(const Params& params) : threads_(params.get_int("intraop_threads")) {}
  static StageDoc describe() {
    return {"intra-op math", {int_param("intraop_threads", 1, "threads per invocation", 1)},
            "intraop_threads"};
  }
  std::size_t threads_per_invocation() const override {
    return static_cast<std::size_t>(threads_);
  }

 protected:
  std::optional<std::uint64_t> process(std::uint64_t&& v, ItemContext&) override { return v; }

 private:
  std::int64_t threads_;
};

const Registry& test_registry() {
  static const Registry registry = [] {
    Registry r = Registry::global();
    r.add({"lines", LinesSource::describe(), LinesSource::static_shape(),
           [](const Params& p, const BuildContext&) { return std::unique_ptr<Stage>(new LinesSource(p)); }});
    r.add({"heavy", HeavyMap::describe(), HeavyMap::static_shape(),
           [](const Params& p, const BuildContext&) { return std::unique_ptr<Stage>(new HeavyMap(p)); }});
    return r;
  }();
  return registry;
}

const char* kGood = R"(threads: 2
stages:
  - type: sequence
    name: numbers
    params: {count: 100}
  - type: spin
    name: work
    concurrency: 2
    params:
      rounds: 10
  - type: batch
    params: {size: 8}
  - type: discard
)";

// Parses `text` and returns the error message ("" if it parsed).
std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    parse_pipeline_config(text, "cfg.yaml", overrides, test_registry());
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find('\n') == std::string::npos);  // always one line
    return e.what();
  }
  return "";
}

std::string replace(std::string text, const std::string& from, const std::string& to) {
  const auto pos = text.find(from);
  REQUIRE(pos != std::string::npos);
  return text.replace(pos, from.size(), to);
}

}  // namespace

TEST_CASE("Config.Valid.ParsesEverything") {
  const PipelineConfig c = parse_pipeline_config(kGood, "cfg.yaml", {}, test_registry());
  CHECK(c.run.threads == 2);
  REQUIRE(c.stages.size() == 4);
  CHECK(c.stages[0].name == "numbers");
  CHECK(c.stages[0].params.get_int("count") == 100);
  CHECK(c.stages[0].params.get_int("start") == 0);  // default filled in
  CHECK(c.stages[1].options.concurrency == 2);
  CHECK(c.stages[1].options.queue_capacity == 8);
  CHECK(c.stages[2].name == "batch");  // name defaults to the type
  CHECK(c.stages[1].location == "cfg.yaml:6");
  auto pipeline = build_pipeline(c, test_registry());
  CHECK(pipeline->size() == 4);
  const RunReport r = pipeline->run(c.run);
  CHECK(r.stages[3].items_in == 13);  // 12 batches of 8 and one of 4
}

TEST_CASE("Config.Errors.NumbersOutOfRange") {
  // Before: batch size 2^31 wrapped to a negative int deep inside the stage (30 stack frames).
  CHECK(error_of(kGood, {"stages.batch.params.size=2147483648"}) ==
        "override 'stages.batch.params.size=2147483648': stage 'batch' (batch): param 'size' must "
        "be <= 1048576, got 2147483648");
  // An int without a declared bound still cannot wrap.
  CHECK(error_of(kGood, {"stages.numbers.params.count=2147483648"}) ==
        "override 'stages.numbers.params.count=2147483648': stage 'numbers' (sequence): param "
        "'count' must be <= 2147483647, got 2147483648");
  CHECK(error_of(kGood, {"stages.numbers.params.count=2147483647"}).empty());
}

TEST_CASE("Config.Errors.DuplicateKeyNamesBothLines") {
  // yaml-cpp keeps both; a lookup saw the first and the second was silently ignored.
  CHECK(error_of(replace(kGood, "threads: 2", "threads: 2\nthreads: 1")) ==
        "cfg.yaml:2: duplicate key 'threads' (first given on line 1); give each key once");
  CHECK(error_of("stages:\n  - {type: sequence, params: {count: 3, count: 4}}\n  - {type: discard}\n") ==
        "cfg.yaml:2: duplicate key 'count' (first given on line 2); give each key once");
}

TEST_CASE("Config.Errors.SelfReferencingAliasIsAnErrorNotACrash") {
  // Every walk over such a config recursed until the stack ran out (exit 139).
  CHECK(error_of("&a {threads: *a}\n") ==
        "cfg.yaml:1: a YAML alias refers to a node that contains it (an endless cycle)");
  CHECK(error_of("stages:\n  - &s {type: spin, params: {next: [*s]}}\n") ==
        "cfg.yaml:2: a YAML alias refers to a node that contains it (an endless cycle)");
  CHECK(error_of(kGood, {"threads=&b [*b]"}) ==
        "override 'threads=&b [*b]':1: a YAML alias refers to a node that contains it (an "
        "endless cycle)");
  // An alias to a node elsewhere is no cycle.
  CHECK(error_of(replace(replace(kGood, "threads: 2", "threads: &d 2"), "count: 100", "count: *d"))
            .empty());
}

namespace {

// Aliases of aliases: level `a` a list of ten values, each later level ten aliases of the one
// before (`b: &b [*a, ...]`), `levels` levels in all.
std::string nested_aliases(char levels) {
  std::string text = "a: &a [x, x, x, x, x, x, x, x, x, x]\n";
  for (char level = 'b'; level < 'a' + levels; ++level) {
    const std::string before(1, static_cast<char>(level - 1));
    text += std::string(1, level) + ": &" + level + " [";
    for (int i = 0; i < 10; ++i) text += (i == 0 ? "*" : ", *") + before;
    text += "]\n";
  }
  return text;
}

}  // namespace

TEST_CASE("Config.Yaml.AliasExpansionIsBounded" * doctest::timeout(20)) {
  // A "billion laughs" of 9 levels (10^9 values in 413 bytes): `flowtrain check` did not finish
  // in 60 s. The line is that of the value whose aliases pass the bound.
  const std::string refused =
      ": the config holds more than 100000 values once its YAML aliases are expanded (aliases "
      "of aliases multiply); use fewer aliases";
  CHECK(error_of(nested_aliases(9)) == "cfg.yaml:5" + refused);
  // Deeper in the config: the line of the list that holds the aliases.
  CHECK(error_of(nested_aliases(4) + "stages:\n  - type: sequence\n    params:\n      count: [" +
                 "*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\n") == "cfg.yaml:8" + refused);
  // In an override's value, on one line.
  std::string flow = nested_aliases(6);
  for (std::size_t at = flow.find('\n'); at != std::string::npos; at = flow.find('\n', at)) {
    flow.replace(at, 1, at + 1 == flow.size() ? "}" : ", ");
  }
  const std::string override_text = "threads={" + flow;
  CHECK(error_of(kGood, {override_text}) == "override '" + override_text + "':1" + refused);
  // Below the bound, aliases are read as before.
  CHECK(error_of(nested_aliases(4) + kGood).find("unknown key 'a'") != std::string::npos);
}

TEST_CASE("Config.Yaml.NulByteIsRefusedWithItsLine") {
  // yaml-cpp read "wo\0rk" as "wo\x1brk": a stage name changed without a word.
  CHECK(error_of(replace(kGood, "name: work", std::string("name: wo\0rk", 11))) ==
        "cfg.yaml:7: a NUL byte in the config; YAML text cannot hold one");
}

TEST_CASE("Config.File.OnlyARegularFileOfAFewMegabytes" * doctest::timeout(20)) {
  // `flowtrain check /dev/zero` read until bad_alloc; a FIFO waited for a writer.
  if (std::filesystem::exists("/dev/zero")) {
    CHECK_THROWS_WITH_AS(
        load_run_config("/dev/zero"),
        "cannot read config '/dev/zero': it is a character device, not a regular file", Error);
  }
  flowtrain::testing::TempDir dir("config");
  const std::string fifo = dir.str("fifo.yaml");
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  CHECK_THROWS_WITH_AS(
      load_run_config(fifo),
      ("cannot read config '" + fifo + "': it is a FIFO, not a regular file").c_str(), Error);
  CHECK_THROWS_WITH_AS(
      load_run_config(dir.str()),
      ("cannot read config '" + dir.str() + "': it is a folder, not a regular file").c_str(),
      Error);
  const std::string huge = dir.str("huge.yaml");
  std::ofstream(huge) << kGood << "#" << std::string(4 << 20, ' ') << "\n";
  CHECK_THROWS_WITH_AS(
      load_run_config(huge),
      ("cannot read config '" + huge + "': it is larger than 4 MiB, the most a config may be")
          .c_str(),
      Error);
}

TEST_CASE("Config.Errors.EachKindNamesFileLineStageAndKey") {
  SUBCASE("unknown stage type") {
    CHECK(error_of(replace(kGood, "type: spin", "type: spni")) ==
          "cfg.yaml:6: unknown stage type 'spni' (did you mean 'spin'?); `flowtrain stages` "
          "lists them (a plugin's, once `plugins:` or --plugin names its library)");
  }
  SUBCASE("misspelled stage key") {
    CHECK(error_of(replace(kGood, "concurrency: 2", "concurency: 2")) ==
          "cfg.yaml:8: stage 'work' (spin): unknown key 'concurency' (did you mean "
          "'concurrency'?)");
  }
  SUBCASE("unknown param") {
    CHECK(error_of(replace(kGood, "rounds: 10", "rouds: 10")) ==
          "cfg.yaml:10: stage 'work' (spin): unknown param 'rouds' (did you mean 'rounds'?)");
  }
  SUBCASE("mistyped param") {
    CHECK(error_of(replace(kGood, "rounds: 10", "rounds: fast")) ==
          "cfg.yaml:10: stage 'work' (spin): param 'rounds' must be an int, got 'fast'");
    CHECK(error_of(replace(kGood, "rounds: 10", "rounds: 2.5")) ==
          "cfg.yaml:10: stage 'work' (spin): param 'rounds' must be an int, got '2.5'");
  }
  SUBCASE("param below its minimum") {
    CHECK(error_of(replace(kGood, "{size: 8}", "{size: 0}")) ==
          "cfg.yaml:12: stage 'batch' (batch): param 'size' must be >= 1, got 0");
  }
  SUBCASE("concurrency below 1") {
    CHECK(error_of(replace(kGood, "concurrency: 2", "concurrency: 0")) ==
          "cfg.yaml:8: stage 'work' (spin): concurrency must be 'serial', 'unlimited' or a whole "
          "number >= 1, got '0'");
  }
  SUBCASE("concurrency on a serial stage") {
    CHECK(error_of(replace(kGood, "params: {size: 8}", "concurrency: 2\n    params: {size: 8}")) ==
          "cfg.yaml:11: stage 'batch' (batch): concurrency 2 is not allowed: a flat map runs "
          "serially");
  }
  SUBCASE("item type mismatch") {
    const std::string text = replace(kGood, "  - type: discard\n",
                                     "  - type: spin\n    name: again\n  - type: discard\n");
    CHECK(error_of(text) ==
          "cfg.yaml:13: item type mismatch: 'again' takes unsigned long, but 'batch' emits "
          "std::vector<unsigned long>");
  }
  SUBCASE("queue smaller than the producer's concurrency") {
    CHECK(error_of(replace(kGood, "params: {size: 8}", "queue_capacity: 1\n    params: {size: 8}"))
              .find("cfg.yaml:11: queue_capacity 1 of 'batch' is below the concurrency 2 of "
                    "'work'") == 0);
  }
  SUBCASE("missing file") {
    const std::string text =
        "stages:\n  - type: lines\n    params: {path: /no/such/file.txt}\n"
        "  - type: discard\n";
    CHECK(error_of(text) ==
          "cfg.yaml:3: stage 'lines' (lines): param 'path' names '/no/such/file.txt', which does "
          "not exist");
    CHECK_THROWS_WITH_AS(load_pipeline_config("/no/such/config.yaml"),
                         "cannot read config '/no/such/config.yaml': no such file", Error);
  }
  SUBCASE("string not among the choices") {
    const std::string text = "stages:\n  - type: lines\n    params: {order: sideways}\n"
                             "  - type: discard\n";
    CHECK(error_of(text) ==
          "cfg.yaml:3: stage 'lines' (lines): param 'order' must be one of forward, backward, got "
          "'sideways'");
  }
  SUBCASE("unknown top-level key") {
    CHECK(error_of(replace(kGood, "threads: 2", "thread: 2")) ==
          "cfg.yaml:1: unknown key 'thread' (did you mean 'threads'?)");
  }
  SUBCASE("duplicate stage names") {
    CHECK(error_of(replace(kGood, "name: work", "name: numbers")) ==
          "cfg.yaml:6: stage 'numbers' (spin): a stage named 'numbers' already exists at "
          "cfg.yaml:3; give one a different 'name'");
  }
  SUBCASE("source not first, sink not last") {
    CHECK(error_of("stages:\n  - type: spin\n  - type: discard\n") ==
          "cfg.yaml:2: the first stage 'spin' must be a source, not a map");
    CHECK(error_of("stages:\n  - type: sequence\n  - type: spin\n") ==
          "cfg.yaml:2: the last stage 'spin' must be a sink, not a map");
  }
  SUBCASE("YAML syntax") {
    CHECK(error_of("stages:\n  - type: [sequence\n").rfind("cfg.yaml:3: YAML syntax error", 0) ==
          0);
  }
}

TEST_CASE("Config.Overrides.ApplyAndReport") {
  const PipelineConfig c =
      parse_pipeline_config(kGood, "cfg.yaml",
                            {"threads=1", "stages.work.concurrency=unlimited",
                             "stages.numbers.params.count=7", "metrics.trace=out.json"},
                            test_registry());
  CHECK(c.run.threads == 1);
  CHECK(c.stages[1].options.concurrency == kUnlimited);
  CHECK(c.stages[0].params.get_int("count") == 7);
  CHECK(c.run.trace_path == "out.json");

  CHECK(error_of(kGood, {"stages.wrk.concurrency=2"}) ==
        "override 'stages.wrk.concurrency=2': no stage named 'wrk' (stages: numbers, work, batch, "
        "discard)");
  CHECK(error_of(kGood, {"stages.work.concurrency=0"}) ==
        "override 'stages.work.concurrency=0': stage 'work' (spin): concurrency must be 'serial', "
        "'unlimited' or a whole number >= 1, got '0'");
  CHECK(error_of(kGood, {"stages.work.params.rouds=3"}) ==
        "override 'stages.work.params.rouds=3': stage 'work' (spin): unknown param 'rouds' (did "
        "you mean 'rounds'?)");
  CHECK(error_of(kGood, {"threads"}) ==
        "override 'threads': expected key.path=value, e.g. stages.decode.concurrency=2");
}

TEST_CASE("Config.Overrides.TheLastOverrideOfAKeyIsTheOneQuoted") {
  // `epochs=1 epochs=0` quoted 'epochs=1' for the 0 it refused.
  CHECK(error_of(kGood, {"stages.batch.params.size=2", "stages.batch.params.size=0"}) ==
        "override 'stages.batch.params.size=0': stage 'batch' (batch): param 'size' must be >= 1, "
        "got 0");
  CHECK(error_of(kGood, {"stages.batch.params.size=0", "stages.batch.params.size=2"}).empty());
  // A key given twice, then other keys: each keeps its own value (dropping the first
  // override's node handle once let yaml-cpp reuse its memory for a later value, and the
  // concurrency below read 0.3).
  const PipelineConfig c =
      parse_pipeline_config(kGood, "good.yaml",
                            {"threads=1", "stages.work.concurrency=1", "autotune.warmup_s=0.3",
                             "autotune.trial_s=0.8", "threads=2", "autotune=false"},
                            test_registry());
  CHECK(c.run.threads == 2);
  CHECK(c.stages[1].options.concurrency == 1);
  CHECK_FALSE(c.run.autotune.enabled);
}

TEST_CASE("Config.Paths.RelativeToTheConfigFile") {
  const auto dir = std::filesystem::temp_directory_path() / "flowtrain_config_test";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "data.txt") << "x\n";
  std::ofstream(dir / "pipeline.yaml")
      << "stages:\n  - type: lines\n    params: {path: data.txt}\n  - type: discard\n";
  const PipelineConfig c =
      load_pipeline_config((dir / "pipeline.yaml").string(), {}, test_registry());
  CHECK(c.stages[0].params.get_string("path") == (dir / "data.txt").string());
  std::filesystem::remove_all(dir);
}

namespace {

const char* kPhases = R"(threads: 2
cores: 4
metrics: {sample_ms: 5, trace: run.json}
phases:
  - name: teacher
    stages:
      - {type: sequence, name: numbers, params: {count: 10}}
      - {type: discard}
  - name: student
    threads: 1
    metrics: {trace: student.json}
    stages:
      - {type: sequence, name: numbers, params: {count: 20}}
      - type: spin
        name: work
        params: {rounds: 10}
      - {type: discard}
  - name: eval
    cores: 2
    stages:
      - {type: sequence, params: {count: 30}}
      - {type: discard}
)";

// Parses `text` as a multi-phase config and returns the error message ("" if it parsed).
std::string run_error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    parse_run_config(text, "kd.yaml", overrides, test_registry());
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find('\n') == std::string::npos);  // always one line
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("Config.Cores.SetAndValidated") {
  const PipelineConfig c = parse_pipeline_config(
      replace(kGood, "threads: 2", "threads: 2\ncores: 3"), "cfg.yaml", {}, test_registry());
  CHECK(c.run.cores == 3);
  CHECK(parse_pipeline_config(kGood, "cfg.yaml", {}, test_registry()).run.cores == 0);
  CHECK(parse_pipeline_config(kGood, "cfg.yaml", {"cores=2"}, test_registry()).run.cores == 2);
  CHECK(error_of(replace(kGood, "threads: 2", "threads: 2\ncores: 0")) ==
        "cfg.yaml:2: cores must be a whole number >= 1, got '0'");
  CHECK(error_of(replace(kGood, "threads: 2", "cores: many")) ==
        "cfg.yaml:1: cores must be a whole number >= 1, got 'many'");
  CHECK(error_of(kGood, {"cores=1.5"}) ==
        "override 'cores=1.5': cores must be a whole number >= 1, got '1.5'");
}

TEST_CASE("Config.Phases.SinglePipelineIsOneUnnamedPhase") {
  const RunConfig c = parse_run_config(kGood, "cfg.yaml", {}, test_registry());
  CHECK(c.origin == "cfg.yaml");
  REQUIRE(c.phases.size() == 1);
  CHECK(c.phases[0].name.empty());
  CHECK(c.phases[0].origin == "cfg.yaml");
  CHECK(c.phases[0].stages.size() == 4);
  CHECK_THROWS_WITH_AS(parse_pipeline_config(kPhases, "kd.yaml", {}, test_registry()),
                       "kd.yaml: the config has 'phases'; read it with load_run_config or "
                       "parse_run_config",
                       Error);
}

TEST_CASE("Config.Phases.InheritDefaults") {
  const RunConfig c = parse_run_config(kPhases, "kd.yaml", {}, test_registry());
  REQUIRE(c.phases.size() == 3);
  const PipelineConfig& teacher = c.phases[0];
  const PipelineConfig& student = c.phases[1];
  const PipelineConfig& eval = c.phases[2];
  CHECK(teacher.name == "teacher");
  CHECK(student.name == "student");
  CHECK(eval.name == "eval");
  CHECK(teacher.origin == "kd.yaml");
  // The top level's values, unless the phase sets its own (per key, also inside metrics).
  CHECK(teacher.run.threads == 2);
  CHECK(student.run.threads == 1);
  CHECK(eval.run.threads == 2);
  CHECK(teacher.run.cores == 4);
  CHECK(student.run.cores == 4);
  CHECK(eval.run.cores == 2);
  CHECK(teacher.run.trace_path == "run.json");
  // The verdict of a phase names its keys under the phase.
  CHECK(teacher.run.key_prefix == "phases.teacher.");
  CHECK(eval.run.key_prefix == "phases.eval.");
  CHECK(parse_run_config(kGood, "cfg.yaml", {}, test_registry()).phases[0].run.key_prefix.empty());
  CHECK(student.run.trace_path == "student.json");
  CHECK(student.run.sample_interval_ms == 5);
  // Stage names need only be unique within a phase; locations are the file's lines.
  CHECK(teacher.stages[0].name == "numbers");
  CHECK(student.stages[0].name == "numbers");
  CHECK(student.stages[1].location == "kd.yaml:14");
  CHECK(student.stages[0].params.get_int("count") == 20);

  // Without top-level values, a phase gets the RunOptions defaults.
  const RunConfig bare =
      parse_run_config("phases:\n  - name: only\n    stages: [{type: sequence}, {type: discard}]\n",
                       "bare.yaml", {}, test_registry());
  CHECK(bare.phases[0].run.threads == 0);
  CHECK(bare.phases[0].run.cores == 0);
  CHECK(bare.phases[0].run.trace_path.empty());

  // Each phase builds and runs on its own.
  for (const PipelineConfig& phase : c.phases) {
    RunOptions options = phase.run;
    options.trace_path.clear();
    options.cores = 0;
    const RunReport r = build_pipeline(phase, test_registry())->run(options);
    CHECK(r.stages.back().items_in ==
          static_cast<std::uint64_t>(phase.stages[0].params.get_int("count")));
  }
}

TEST_CASE("Config.Phases.ThreadBudgetCheckedPerPhase") {
  // A budget only the last phase breaks: check_thread_budget, which run_phases calls for every
  // phase it will run before the first, names the phase and where its stages start.
  const std::string heavy = replace(kPhases, "      - {type: sequence, params: {count: 30}}\n",
                                    "      - {type: sequence, params: {count: 30}}\n"
                                    "      - {type: heavy, params: {intraop_threads: 4}}\n");
  const RunConfig config = parse_run_config(heavy, "kd.yaml", {}, test_registry());
  check_thread_budget(config.phases[0], test_registry());
  check_thread_budget(config.phases[1], test_registry());
  CHECK_THROWS_WITH_AS(check_thread_budget(config.phases[2], test_registry()),
                       "kd.yaml:21: phase 'eval': thread budget: up to 5 threads could run at once "
                       "(2 graph threads, 'heavy' 4 intra-op threads), more than the 2 cores "
                       "granted; lower threads or a stage's intraop_threads, or raise cores",
                       Error);
  const RunConfig more = parse_run_config(heavy, "kd.yaml", {"phases.eval.cores=5"}, test_registry());
  check_thread_budget(more.phases[2], test_registry());
}

TEST_CASE("Config.Threads.AutoFillsTheCoresGrantedAndRanksShareThem") {
  const auto threads_of = [](const PipelineConfig& phase) {
    std::vector<std::int64_t> out;
    for (const StageConfig& s : phase.stages) {
      if (s.type == "heavy") out.push_back(s.params.get_int("intraop_threads"));
    }
    return out;
  };
  // One graph thread: the compute stage takes every core; two graph threads that may run both
  // heavy stages at once: one each; an explicit count next to `auto` leaves it the rest.
  const std::string text =
      "cores: 4\nphases:\n"
      "  - {name: one, threads: 1, stages: [{type: sequence}, "
      "{type: heavy, params: {intraop_threads: auto}}, {type: discard}]}\n"
      "  - {name: two, threads: 2, stages: [{type: sequence}, "
      "{type: heavy, name: a, params: {intraop_threads: auto}}, "
      "{type: heavy, name: b, params: {intraop_threads: auto}}, {type: discard}]}\n"
      "  - {name: mixed, threads: 2, stages: [{type: sequence}, "
      "{type: heavy, name: a, params: {intraop_threads: 3}}, "
      "{type: heavy, name: b, params: {intraop_threads: auto}}, {type: discard}]}\n";
  RunConfig config = parse_run_config(text, "auto.yaml", {}, test_registry());
  CHECK(threads_of(config.phases[0]) == std::vector<std::int64_t>{4});
  CHECK(threads_of(config.phases[1]) == std::vector<std::int64_t>{2, 2});
  CHECK(threads_of(config.phases[2]) == std::vector<std::int64_t>{3, 1});
  for (const PipelineConfig& phase : config.phases) check_thread_budget(phase, test_registry());

  // Two ranks on the machine: each is granted 2 of the 4 cores, and `auto` follows.
  for (PipelineConfig& phase : config.phases) {
    phase.run.local_ranks = 2;
    resolve_auto_threads(phase, test_registry());
  }
  CHECK(threads_and_cores(config.phases[0].run) == std::pair<std::size_t, std::size_t>{1, 2});
  CHECK(threads_of(config.phases[0]) == std::vector<std::int64_t>{2});
  CHECK(threads_of(config.phases[1]) == std::vector<std::int64_t>{1, 1});
  check_thread_budget(config.phases[1], test_registry());
  // An explicit count that no longer fits is reported, with the share.
  CHECK_THROWS_WITH_AS(check_thread_budget(config.phases[2], test_registry()),
                       doctest::Contains("more than the 2 cores granted (4 shared by 2 ranks on "
                                         "this machine)"),
                       Error);
  // The graph threads default to the cores granted.
  RunOptions options;
  options.cores = 4;
  options.local_ranks = 4;
  CHECK(threads_and_cores(options) == std::pair<std::size_t, std::size_t>{1, 1});
  options.local_ranks = 5;
  CHECK(thread_budget_problem({}, options) ==
        "thread budget: no core for each rank (4 shared by 5 ranks on this machine); start fewer "
        "ranks or raise cores");
  // `auto` is for the threads param only.
  CHECK_THROWS_WITH_AS(
      parse_run_config("stages: [{type: sequence, params: {count: auto}}, {type: discard}]\n",
                       "auto.yaml", {}, test_registry()),
      doctest::Contains("param 'count' must be an int, got 'auto'"), Error);
}

TEST_CASE("Config.Phases.Errors") {
  SUBCASE("both stages and phases") {
    CHECK(run_error_of(std::string(kPhases) + "stages: []\n") ==
          "kd.yaml:4: a config has 'stages' (one pipeline) or 'phases' (pipelines run in turn), "
          "not both");
  }
  SUBCASE("neither stages nor phases") {
    CHECK(run_error_of("threads: 2\nmetrics: {sample_ms: 5}\n") ==
          "kd.yaml:1: missing key 'stages' (the list of stages to run) or 'phases' (a list of "
          "pipelines run in turn)");
  }
  SUBCASE("duplicate phase name") {
    CHECK(run_error_of(replace(kPhases, "name: eval", "name: teacher")) ==
          "kd.yaml:18: phase 'teacher': a phase named 'teacher' already exists at kd.yaml:5; give "
          "one a different 'name'");
  }
  SUBCASE("phase without a name") {
    CHECK(run_error_of(replace(kPhases, "  - name: eval\n", "  -\n")) ==
          "kd.yaml:19: phase without a 'name'");
  }
  SUBCASE("an error in a later phase names the phase and the line") {
    CHECK(run_error_of(replace(kPhases, "rounds: 10", "rouns: 10")) ==
          "kd.yaml:16: phase 'student': stage 'work' (spin): unknown param 'rouns' (did you mean "
          "'rounds'?)");
    CHECK(run_error_of(replace(kPhases, "    cores: 2", "    cores: 0")) ==
          "kd.yaml:19: phase 'eval': cores must be a whole number >= 1, got '0'");
    CHECK(run_error_of(replace(kPhases, "{type: sequence, params: {count: 30}}", "{type: spin}")) ==
          "kd.yaml:21: phase 'eval': the first stage 'spin' must be a source, not a map");
  }

  SUBCASE("unknown keys") {
    CHECK(run_error_of(replace(kPhases, "    threads: 1", "    thread: 1")) ==
          "kd.yaml:10: phase 'student': unknown key 'thread' (did you mean 'threads'?)");
    CHECK(run_error_of(replace(kPhases, "    cores: 2\n    stages:", "    cores: 2\n    stags:")) ==
          "kd.yaml:20: phase 'eval': unknown key 'stags' (did you mean 'stages'?)");
  }
  SUBCASE("not a list") {
    CHECK(run_error_of("phases: {name: a}\n") ==
          "kd.yaml:1: 'phases' must be a list of maps, each with a 'name' and 'stages'");
  }
}

TEST_CASE("Config.Phases.Overrides") {
  const RunConfig c = parse_run_config(
      kPhases, "kd.yaml",
      {"threads=3", "phases.eval.threads=4", "phases.student.stages.work.params.rounds=7",
       "phases.student.stages.numbers.concurrency=serial", "phases.teacher.cores=2"},
      test_registry());
  CHECK(c.phases[0].run.threads == 3);  // the new top-level default
  CHECK(c.phases[1].run.threads == 1);  // the phase's own value wins over the default
  CHECK(c.phases[2].run.threads == 4);
  CHECK(c.phases[0].run.cores == 2);
  CHECK(c.phases[1].stages[1].params.get_int("rounds") == 7);

  CHECK(run_error_of(kPhases, {"phases.distill.threads=1"}) ==
        "override 'phases.distill.threads=1': no phase named 'distill' (phases: teacher, student, "
        "eval)");
  CHECK(run_error_of(kPhases, {"phases.student.stages.wrk.concurrency=2"}) ==
        "override 'phases.student.stages.wrk.concurrency=2': no stage named 'wrk' (stages: "
        "numbers, work, discard)");
  CHECK(run_error_of(kPhases, {"stages.work.concurrency=2"}) ==
        "override 'stages.work.concurrency=2': the config has no 'stages' list here");
  CHECK(run_error_of(kPhases, {"phases.student.stages.work.params.rouds=3"}) ==
        "override 'phases.student.stages.work.params.rouds=3': phase 'student': stage 'work' "
        "(spin): unknown param 'rouds' (did you mean 'rounds'?)");
  CHECK(run_error_of(kPhases, {"phases.eval.cores=none"}) ==
        "override 'phases.eval.cores=none': phase 'eval': cores must be a whole number >= 1, got "
        "'none'");
}

namespace {

const std::vector<ConfigSection> kSections = {
    {"data",
     "where the photos are and how they are split",
     {path_param("folder", "prepared data folder"),
      float_param("val_fraction", 0.2, "share held out for validation", 0, 0.9),
      int_param("seed", 1, "seed of the split"),
      output_path_param("runs", "where runs are written")}},
    {"report", "the HTML report", {bool_param("open", false, "open it when done")}},
};

// kGood with a `data:` section after `threads:`, at lines 2-4.
std::string with_data(const std::string& data = "  val_fraction: 0.3\n  seed: 7\n") {
  return replace(kGood, "threads: 2\n", "threads: 2\ndata:\n" + data);
}

std::string section_error_of(const std::string& text,
                             const std::vector<std::string>& overrides = {}) {
  try {
    parse_run_config(text, "cfg.yaml", overrides, kSections, test_registry());
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find('\n') == std::string::npos);  // always one line
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("Config.Sections.DefaultsAndGivenValues") {
  const RunConfig c = parse_run_config(with_data(), "cfg.yaml", {}, kSections, test_registry());
  REQUIRE(c.sections.size() == 2);
  const Params& data = c.sections.at("data");
  CHECK(data.get_float("val_fraction") == 0.3);
  CHECK(data.get_int("seed") == 7);
  CHECK(data.get_string("folder").empty());                  // not given: the default
  CHECK(c.sections.at("report").get_bool("open") == false);  // absent section: all defaults
  CHECK(c.phases[0].stages.size() == 4);                     // the pipeline is read as before

  // An empty section is all defaults; without declared sections there are none.
  CHECK(parse_run_config(replace(kGood, "threads: 2\n", "threads: 2\ndata:\n"), "cfg.yaml", {},
                         kSections, test_registry())
            .sections.at("data")
            .get_int("seed") == 1);
  CHECK(parse_run_config(kGood, "cfg.yaml", {}, test_registry()).sections.empty());
}

TEST_CASE("Config.Sections.Overrides") {
  const RunConfig c =
      parse_run_config(with_data(), "cfg.yaml", {"data.val_fraction=0.5", "report.open=true"},
                       kSections, test_registry());
  CHECK(c.sections.at("data").get_float("val_fraction") == 0.5);
  CHECK(c.sections.at("data").get_int("seed") == 7);
  CHECK(c.sections.at("report").get_bool("open") == true);  // a section the file lacks
  CHECK(section_error_of(with_data(), {"data.val_fracton=0.5"}) ==
        "override 'data.val_fracton=0.5': data: unknown key 'val_fracton' (did you mean "
        "'val_fraction'?)");
  CHECK(section_error_of(with_data(), {"data.seed=many"}) ==
        "override 'data.seed=many': data.seed must be an int, got 'many'");
}

TEST_CASE("Config.Sections.Errors") {
  SUBCASE("misspelled key names its line and suggests") {
    CHECK(section_error_of(with_data("  val_fracton: 0.3\n")) ==
          "cfg.yaml:3: data: unknown key 'val_fracton' (did you mean 'val_fraction'?)");
  }
  SUBCASE("wrong type") {
    CHECK(section_error_of(with_data("  val_fraction: lots\n")) ==
          "cfg.yaml:3: data.val_fraction must be a float, got 'lots'");
    CHECK(section_error_of(with_data("  val_fraction: -1\n")) ==
          "cfg.yaml:3: data.val_fraction must be >= 0, got -1");
  }
  SUBCASE("not a map") {
    CHECK(section_error_of(replace(kGood, "threads: 2\n", "threads: 2\nreport: yes\n")) ==
          "cfg.yaml:2: report must be a map of key: value");
  }
  SUBCASE("missing path") {
    CHECK(section_error_of(with_data("  folder: /no/such/folder\n")) ==
          "cfg.yaml:3: data.folder names '/no/such/folder', which does not exist");
  }
  SUBCASE("unknown top-level key suggests among keys and sections") {
    CHECK(section_error_of(replace(kGood, "threads: 2\n", "threads: 2\ndta: {}\n")) ==
          "cfg.yaml:2: unknown key 'dta' (did you mean 'data'?)");
    CHECK(section_error_of(replace(kGood, "threads: 2\n", "thread: 2\n")) ==
          "cfg.yaml:1: unknown key 'thread' (did you mean 'threads'?)");
    // Undeclared, a section is an unknown key like any other.
    CHECK(error_of(with_data()).rfind("cfg.yaml:2: unknown key 'data' (known: threads, ", 0) == 0);
  }
  SUBCASE("a section named like a built-in key") {
    CHECK_THROWS_WITH_AS(
        parse_run_config(kGood, "cfg.yaml", {}, std::vector<ConfigSection>{{"threads", "", {}}}),
        "config section 'threads' has the name of a built-in key", Error);
  }
}

// `${cwd}` is the folder the command runs in, whatever folder holds the config, and a key
// holding it can itself be referred to.
TEST_CASE("Config.Sections.CwdIsTheWorkingDirectory") {
  const auto dir = std::filesystem::temp_directory_path() / "flowtrain_cwd_test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir / "photos");
  std::ofstream(dir / "data.txt") << "x\n";
  const std::filesystem::path previous = std::filesystem::current_path();
  std::filesystem::current_path(dir);
  const std::string text = "data: {folder: \"${cwd}/photos\", runs: \"${data.folder}/runs\"}\n"
                           "stages:\n  - type: lines\n    params: {path: \"${cwd}/data.txt\"}\n"
                           "  - type: discard\n";
  const RunConfig c = parse_run_config(text, "/elsewhere/app.yaml", {}, kSections, test_registry());
  std::filesystem::current_path(previous);
  CHECK(c.sections.at("data").get_string("folder") == (dir / "photos").string());
  CHECK(c.sections.at("data").get_string("runs") == (dir / "photos/runs").string());
  CHECK(c.phases[0].stages[0].params.get_string("path") == (dir / "data.txt").string());
  std::filesystem::remove_all(dir);
}

TEST_CASE("Config.Sections.PathsAndEffectiveText") {
  const auto dir = std::filesystem::temp_directory_path() / "flowtrain_sections_test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir / "photos");
  std::filesystem::create_directories(dir / "saved");
  std::ofstream(dir / "data.txt") << "x\n";
  const std::string path = (dir / "app.yaml").string();
  std::ofstream(path) << "threads: 2\n"
                         "data: {folder: photos, runs: out/runs}\n"
                         "stages:\n"
                         "  - type: lines\n"
                         "    params: {path: data.txt}\n"
                         "  - type: discard\n";
  const std::vector<std::string> overrides = {"data.val_fraction=0.4", "threads=1"};
  const RunConfig c = load_run_config(path, overrides, kSections, test_registry());
  // Paths are relative to the config's folder, for sections as for stage params.
  CHECK(c.sections.at("data").get_string("folder") == (dir / "photos").string());
  CHECK(c.sections.at("data").get_string("runs") == (dir / "out/runs").string());
  CHECK(c.sections.at("data").get_float("val_fraction") == 0.4);

  // The effective text says where it came from and reads back to the same values, also from
  // another folder.
  CHECK(c.effective_text.rfind(
            "# effective config of " + path + " with overrides: data.val_fraction=0.4, threads=1\n",
            0) == 0);
  CHECK(c.effective_text.find("val_fraction: 0.4") != std::string::npos);
  std::ofstream(dir / "saved" / "config.yaml") << c.effective_text;
  for (const RunConfig& again :
       {parse_run_config(c.effective_text, "again.yaml", {}, kSections, test_registry()),
        load_run_config((dir / "saved" / "config.yaml").string(), {}, kSections,
                        test_registry())}) {
    CHECK(again.phases[0].run.threads == 1);
    REQUIRE(again.phases[0].stages.size() == 2);
    CHECK(again.phases[0].stages[0].params.values() == c.phases[0].stages[0].params.values());
    CHECK(again.sections.at("data").values() == c.sections.at("data").values());
    CHECK(again.sections.at("report").values() == c.sections.at("report").values());
  }
  const RunConfig plain = parse_run_config(kGood, "cfg.yaml", {}, test_registry());
  CHECK(plain.effective_text.rfind("# effective config of cfg.yaml (no overrides)\n", 0) == 0);
  std::filesystem::remove_all(dir);
}

TEST_CASE("Config.Sections.Markdown") {
  const std::string md = sections_markdown(kSections);
  CHECK(md.rfind("### `data`\n\nwhere the photos are and how they are split\n\n"
                 "| key | type | default | meaning |\n|---|---|---|---|\n"
                 "| `folder` | path | `\"\"` | prepared data folder |\n"
                 "| `val_fraction` | float | `0.2` | share held out for validation (at most 0.9) "
                 "|\n",
                 0) == 0);
  CHECK(md.find("### `report`\n\nthe HTML report\n\n| key |") != std::string::npos);
  CHECK(md.find("| `open` | bool | `false` | open it when done |\n") != std::string::npos);
  // The stage reference keeps its own shape.
  CHECK(stages_markdown(test_registry()).find("| param | type | default | meaning |") !=
        std::string::npos);
}

TEST_CASE("Config.Interpolation.ReferencesResolveAfterOverrides") {
  const auto dir = std::filesystem::temp_directory_path() / "flowtrain_interpolation_test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir / "photos");
  std::filesystem::create_directories(dir / "other");
  std::ofstream(dir / "photos" / "data.txt") << "x\n";
  std::ofstream(dir / "other" / "data.txt") << "y\n";
  const std::string path = (dir / "app.yaml").string();
  std::ofstream(path) << "data: {folder: photos, runs: out}\n"
                         "stages:\n"
                         "  - type: lines\n"
                         "    params: {path: \"${data.folder}/data.txt\"}\n"
                         "  - type: discard\n";
  const RunConfig c = load_run_config(path, {}, kSections, test_registry());
  CHECK(c.phases[0].stages[0].params.get_string("path") == (dir / "photos/data.txt").string());
  // Only the sections, for work before the stages' inputs exist.
  CHECK(load_config_sections(path, {}, kSections).at("data").get_string("folder") ==
        (dir / "photos").string());

  // A value given on the command line keeps its origin: relative to the shell's folder.
  const std::filesystem::path cwd = std::filesystem::current_path();
  std::filesystem::current_path(dir / "other");
  const RunConfig moved = load_run_config(path, {"data.folder=."}, kSections, test_registry());
  std::filesystem::current_path(cwd);
  CHECK(moved.phases[0].stages[0].params.get_string("path") == "data.txt");
  // The effective text keeps the reference and the referred value, absolute: read back from
  // any folder it names the same file, and an override of the key moves the value with it.
  CHECK(moved.effective_text.find("path: \"${data.folder}/data.txt\"") != std::string::npos);
  const RunConfig again = parse_run_config(moved.effective_text, "again.yaml", {}, kSections,
                                           test_registry());
  CHECK(again.phases[0].stages[0].params.get_string("path") == (dir / "other/data.txt").string());
  const RunConfig elsewhere = parse_run_config(
      moved.effective_text, "again.yaml", {"data.folder=" + (dir / "photos").string()}, kSections,
      test_registry());
  CHECK(elsewhere.phases[0].stages[0].params.get_string("path") ==
        (dir / "photos/data.txt").string());

  // A reference to no key names it.
  CHECK_THROWS_WITH_AS(load_run_config(path, {"stages.lines.params.path=\"${data.fodler}/x\""}, kSections,
                                       test_registry()),
                       doctest::Contains("'${data.fodler}' names no key with a value"), Error);
  std::filesystem::remove_all(dir);
}

TEST_CASE("Config.Autotune.BoolOrMapAtTheTopOrPerPhase") {
  const auto run_of = [](const std::string& text, const std::vector<std::string>& overrides = {}) {
    return parse_pipeline_config(text, "cfg.yaml", overrides, test_registry()).run.autotune;
  };
  CHECK_FALSE(run_of(kGood).enabled);
  CHECK(run_of("autotune: true\n" + std::string(kGood)).enabled);
  CHECK(run_of(kGood, {"autotune=true"}).enabled);
  const AutotuneOptions a =
      run_of("autotune: {trial_s: 5, warmup_s: 0, max_trials: 6, min_gain: 0.1}\n" + std::string(kGood));
  CHECK(a.enabled);  // a map turns it on unless it says `enabled: false`
  CHECK(a.trial_s == 5);
  CHECK(a.warmup_s == 0);
  CHECK(a.max_trials == 6);
  CHECK(a.min_gain == doctest::Approx(0.1));
  CHECK_FALSE(run_of("autotune: {enabled: false}\n" + std::string(kGood)).enabled);

  CHECK(error_of("autotune: sometimes\n" + std::string(kGood)) ==
        "cfg.yaml:1: autotune must be true, false or a map of its settings, got 'sometimes'");
  CHECK(error_of("autotune: {trial_ms: 5}\n" + std::string(kGood)) ==
        "cfg.yaml:1: autotune: unknown key 'trial_ms' (did you mean 'trial_s'?)");
  CHECK(error_of("autotune: {trial_s: 0}\n" + std::string(kGood)) ==
        "cfg.yaml:1: autotune.trial_s must be a number in [0.1, 600], got '0'");
  CHECK(error_of("autotune: {max_trials: 0}\n" + std::string(kGood)) ==
        "cfg.yaml:1: autotune.max_trials must be a whole number >= 1, got '0'");

  // Per phase, over the top level's.
  const RunConfig phases = parse_run_config(
      "autotune: true\nphases:\n"
      "  - {name: a, stages: [{type: sequence, params: {count: 5}}, {type: discard}]}\n"
      "  - {name: b, autotune: false, stages: [{type: sequence, params: {count: 5}}, {type: discard}]}\n",
      "kd.yaml", {}, test_registry());
  CHECK(phases.phases[0].run.autotune.enabled);
  CHECK_FALSE(phases.phases[1].run.autotune.enabled);
}
