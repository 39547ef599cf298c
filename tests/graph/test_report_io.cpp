#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#include "graph/child_process.hpp"
#include "graph/csv.hpp"
#include "graph/error.hpp"
#include "graph/pipeline.hpp"
#include "graph/report_io.hpp"
#include "tests/process.hpp"
#include "tests/temp_dir.hpp"
#include "tests/test_stages.hpp"

using namespace flowtrain;
using namespace flowtrain::testing;
namespace fs = std::filesystem;

namespace {

// A sink that reports a few numbers after the run.
class ResultSink final : public Sink<std::uint64_t> {
 public:
  std::vector<StageResult> results() const override {
    return {{"items", static_cast<double>(count_.load())}, {"loss", 0.1 + 0.2}, {"top1", 1.0 / 3}};
  }

 protected:
  void consume(std::uint64_t&&, ItemContext&) override { count_.fetch_add(1); }

 private:
  std::atomic<std::uint64_t> count_{0};
};

// A report with every field filled: a real run with drops, a queue series and results, plus
// the fields a run leaves empty here.
RunReport full_report() {
  Pipeline p;
  p.add("source", std::make_unique<CountSource<>>(300));
  p.add("filter: odd \"ones\"",
        std::make_unique<ProbeMap<>>(
            [](std::uint64_t&& v, ItemContext& ctx) -> std::optional<std::uint64_t> {
              if (v % 2) return ctx.drop("odd: value " + std::to_string(v) + " # 'quoted'");
              sleep_us(200);
              return v;
            }),
        {.concurrency = 2});
  p.add("sink", std::make_unique<ResultSink>());
  RunReport r = p.run({.threads = 2, .key_prefix = "phases.distill."});
  r.trace_path = "runs/1/trace.json";
  r.drops_path = "runs/1/drops.csv";
  r.stopped = true;
  r.stages[0].busy_fraction = std::numeric_limits<double>::infinity();  // survives as .inf
  r.stages[1].kind = StageShape::Kind::kJoin;  // a graph's kinds read back, not only a chain's
  r.stages[1].waiting = {0.125, "a free \"widget\"", "pool_size", 3};
  r.autotune = AutotuneReport{{{"start", "2 graph threads; filter x2", 412.5, true},
                                {"'filter' concurrency 2 -> 3, graph threads 2 -> 3",
                                 "3 graph threads; filter x3", 398.25, false}},
                               {"phases.distill.threads=3"},
                               2.5,
                               1234};
  if (r.cpu.core_mean.empty()) {  // no /proc/stat here: fill it by hand
    r.cpu = {0.25, {0.25, 0.5}, {{0.9, 1}, {0, 0.125}}, {0.95, 0.0625}, 0.7};
  }
  return r;
}

// A report built by hand, every number fixed (no run), with each kind of value the writers
// write: empty and full lists, a wait, autotune, inf and nan, strings that need quoting or
// escaping.
RunReport fixed_report() {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  RunReport r;
  r.wall_s = 12.5;
  r.threads = 2;
  r.cores = 4;
  r.peak_threads = 2;
  r.stopped = true;
  r.trace_path = "runs/1/trace.json";
  r.key_prefix = "phases.distill.";
  StageReport& source = r.stages.emplace_back();
  source.name = "source";
  source.kind = StageShape::Kind::kSource;
  source.items_out = 3;
  source.busy_fraction = kInf;
  StageReport& filter = r.stages.emplace_back();
  filter.name = "filter: odd";
  filter.concurrency = 2;
  filter.max_concurrency = kUnlimited;
  filter.workers = 2;
  filter.queue_capacity = 8;
  filter.items_in = 3;
  filter.items_out = 2;
  filter.intra_op_parallel = true;
  filter.item = "Batch";
  filter.dropped = 1;
  filter.drops = {{1, "odd \"one\" in C:\\data\nline 2\x01"}};
  filter.busy_s = 0.1 + 0.2;
  filter.busy_fraction = std::numeric_limits<double>::quiet_NaN();
  filter.starved_fraction = 1.0 / 3;
  filter.peak_active = 2;
  filter.waiting = {0.125, "a free \"buffer\"", "pool_size", 3, false, true};
  filter.queue_mean = 1.5;
  filter.queue_max = 4;
  filter.queue_series = {{0, 1}, {0.5, 4}};
  filter.results = {{"loss", -kInf}, {"top1", 1e-300}, {"steps", 6}};
  r.cpu = {0.25, {0, 0.25}, {{0.5, 1}, {0, 0.125}}, {0.75, 0.0625}, 1.5, 42};
  r.autotune =
      AutotuneReport{{{"start", "2 graph threads; filter x2", 412.5, true, false},
                      {"'filter' concurrency 2 -> 3", "3 graph threads", 398.25, false, true}},
                     {"phases.distill.threads=3"},
                     2.5,
                     1234,
                     0.5};
  return r;
}

void check_same(const RunReport& a, const RunReport& b) {
  CHECK(a.wall_s == b.wall_s);
  CHECK(a.threads == b.threads);
  CHECK(a.cores == b.cores);
  CHECK(a.peak_threads == b.peak_threads);
  CHECK(a.stopped == b.stopped);
  CHECK(a.trace_path == b.trace_path);
  CHECK(a.drops_path == b.drops_path);
  CHECK(a.key_prefix == b.key_prefix);
  REQUIRE(a.autotune.has_value() == b.autotune.has_value());
  if (a.autotune) CHECK(format_autotune(*a.autotune) == format_autotune(*b.autotune));
  CHECK(a.cpu.interval_s == b.cpu.interval_s);
  CHECK(a.cpu.times_s == b.cpu.times_s);
  CHECK(a.cpu.cores == b.cpu.cores);
  CHECK(a.cpu.core_mean == b.cpu.core_mean);
  CHECK(a.cpu.process_cpu_s == b.cpu.process_cpu_s);
  CHECK(a.cpu.page_faults == b.cpu.page_faults);
  REQUIRE(a.stages.size() == b.stages.size());
  for (std::size_t i = 0; i < a.stages.size(); ++i) {
    const StageReport& x = a.stages[i];
    const StageReport& y = b.stages[i];
    CAPTURE(x.name);
    CHECK(x.name == y.name);
    CHECK(x.kind == y.kind);
    CHECK(x.concurrency == y.concurrency);
    CHECK(x.max_concurrency == y.max_concurrency);
    CHECK(x.workers == y.workers);
    CHECK(x.queue_capacity == y.queue_capacity);
    CHECK(x.threads_per_invocation == y.threads_per_invocation);
    CHECK(x.intra_op_parallel == y.intra_op_parallel);  // the verdict's advice depends on it
    CHECK(x.item == y.item);
    CHECK(x.items_in == y.items_in);
    CHECK(x.items_out == y.items_out);
    CHECK(x.dropped == y.dropped);
    REQUIRE(x.drops.size() == y.drops.size());
    for (std::size_t j = 0; j < x.drops.size(); ++j) {
      CHECK(x.drops[j].seq == y.drops[j].seq);
      CHECK(x.drops[j].reason == y.drops[j].reason);
    }
    CHECK(x.busy_s == y.busy_s);
    CHECK(x.busy_fraction == y.busy_fraction);
    CHECK(x.starved_fraction == y.starved_fraction);
    CHECK(x.blocked_fraction == y.blocked_fraction);
    CHECK(x.peak_active == y.peak_active);
    CHECK(x.waiting.seconds == y.waiting.seconds);
    CHECK(x.waiting.what == y.waiting.what);
    CHECK(x.waiting.param == y.waiting.param);
    CHECK(x.waiting.value == y.waiting.value);
    CHECK(x.queue_mean == y.queue_mean);
    CHECK(x.queue_max == y.queue_max);
    REQUIRE(x.queue_series.size() == y.queue_series.size());
    for (std::size_t j = 0; j < x.queue_series.size(); ++j) {
      CHECK(x.queue_series[j].time_s == y.queue_series[j].time_s);
      CHECK(x.queue_series[j].occupancy == y.queue_series[j].occupancy);
    }
    REQUIRE(x.results.size() == y.results.size());
    for (std::size_t j = 0; j < x.results.size(); ++j) {
      CHECK(x.results[j].name == y.results[j].name);
      CHECK(x.results[j].value == y.results[j].value);
    }
  }
}

std::string error_of(const std::string& text) {
  try {
    report_from_yaml(text, "r.yaml");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Reads `json` with Python's json module, strictly (UTF-8, no NaN or Infinity, no raw control
// characters in strings), and returns the value at each path ("stages/1/drops/0/reason"): a
// string as it is, a number as Python's repr (strtod reads it back exactly), null, true or
// false, an object's keys joined by ',', a list's length.
std::vector<std::string> python_json(const std::string& json,
                                     const std::vector<std::string>& paths) {
  static const char* const kScript = R"(
import json, sys
def refuse(name): raise ValueError('not JSON: ' + name)
with open(sys.argv[1], encoding='utf-8') as f: doc = json.load(f, parse_constant=refuse)
for path in sys.argv[2:]:
    v = doc
    for part in filter(None, path.split('/')):
        v = v[int(part)] if isinstance(v, list) else v[part]
    if isinstance(v, dict): out = ','.join(v)
    elif isinstance(v, list): out = str(len(v))
    elif v is None: out = 'null'
    elif isinstance(v, bool): out = 'true' if v else 'false'
    elif isinstance(v, str): out = v
    else: out = repr(v)
    sys.stdout.buffer.write(out.encode('utf-8') + b'\0')
)";
  const TempDir dir("report-json");
  std::ofstream(dir / "r.json", std::ios::binary) << json;
  std::vector<std::string> argv = {"/usr/bin/python3", "-c", kScript, dir.str("r.json")};
  argv.insert(argv.end(), paths.begin(), paths.end());
  const Exit e = wait_for(spawn(argv, {}, dir.str("out")), 60);
  REQUIRE_MESSAGE(e.status() == 0, e.output);
  std::vector<std::string> values;
  for (std::size_t start = 0, end; (end = e.output.find('\0', start)) != std::string::npos;
       start = end + 1) {
    values.push_back(e.output.substr(start, end - start));
  }
  REQUIRE(values.size() == paths.size());
  return values;
}

}  // namespace

TEST_CASE("ReportIo.RoundTrip.EveryFieldAndTheTextsBuiltFromThem" * doctest::timeout(60)) {
  const RunReport original = full_report();
  REQUIRE(original.stages[1].dropped == 150);
  REQUIRE(!original.stages[1].queue_series.empty());
  REQUIRE(original.stages[2].results.size() == 3);

  const std::string text = report_to_yaml(original);
  CHECK(text.rfind("flowtrain_report: 1\n", 0) == 0);
  const RunReport again = report_from_yaml(text, "r.yaml");
  check_same(original, again);
  CHECK(again.verdict() == original.verdict());
  CHECK(again.layout() == original.layout());
  CHECK(format_report(again) == format_report(original));
  CHECK(report_to_yaml(again) == text);

  // An empty report too.
  check_same(report_from_yaml(report_to_yaml(RunReport{}), "empty.yaml"), RunReport{});
}

TEST_CASE("ReportIo.File.WriteAtomicallyAndReadBack" * doctest::timeout(60)) {
  const auto dir = std::filesystem::temp_directory_path() / "flowtrain_report_io_test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "distill.report.yaml").string();
  const RunReport original = full_report();
  std::ofstream(path) << "an older file, replaced whole\n";
  write_report_file(original, path);
  CHECK(!std::filesystem::exists(path + ".tmp"));
  const RunReport again = read_report_file(path);
  check_same(original, again);
  CHECK(format_report(again) == format_report(original));

  const std::string unwritable = (dir / "no/such/r.yaml").string();
  const std::string unwritable_error = "cannot write " + unwritable + ": cannot create " +
                                       unwritable + ".tmp (No such file or directory)";
  CHECK_THROWS_WITH_AS(write_report_file(original, unwritable),
                       doctest::Contains(unwritable_error.c_str()), Error);
  CHECK_THROWS_WITH_AS(
      read_report_file((dir / "missing.yaml").string()),
      ("cannot read run report '" + (dir / "missing.yaml").string() + "': no such file").c_str(),
      Error);
  const std::string config = (dir / "config.yaml").string();
  std::ofstream(config) << "threads: 2\nstages: []\n";
  CHECK_THROWS_WITH_AS(read_report_file(config),
                       (config + ": not a run report (no 'flowtrain_report' key)").c_str(), Error);
  std::filesystem::remove_all(dir);
}

TEST_CASE("ReportIo.Errors.NameTheOriginLineAndField") {
  CHECK(error_of("flowtrain_report: [1\n")
            .rfind("r.yaml:2: not a run report: YAML syntax error", 0) == 0);
  CHECK(error_of("- 1\n- 2\n") == "r.yaml: not a run report (no 'flowtrain_report' key)");
  CHECK(error_of("flowtrain_report: 9\n") ==
        "r.yaml:1: run report format 9 is not the one this build reads (1)");
  CHECK(error_of("flowtrain_report: 1\nwall_s: long\n") ==
        "r.yaml:2: 'wall_s' must be a number, got 'long'");
  CHECK(error_of("flowtrain_report: 1\nstages:\n  - name: a\n    busy_s: fast\n") ==
        "r.yaml:4: 'stages[0].busy_s' must be a number, got 'fast'");
  CHECK(error_of("flowtrain_report: 1\nstages:\n  - name: a\n    kind: pump\n") ==
        "r.yaml:4: 'stages[0].kind' must be one of source, map, flat map, sink, join, router, "
        "merge, mix, got 'pump'");
  CHECK(error_of("flowtrain_report: 1\ncpu: {cores: [[0.5, x]]}\n") ==
        "r.yaml:2: 'cpu.cores[0][1]' must be a number");
  CHECK(error_of("flowtrain_report: 1\nthreads: -2\n") ==
        "r.yaml:2: 'threads' must be a whole number >= 0, got '-2'");
  CHECK(error_of("flowtrain_report: 1\nstages:\n  - name: a\n    queue_series:\n"
                 "      {time_s: [0, 1], occupancy: [3]}\n") ==
        "r.yaml:5: 'stages[0].queue_series' has 2 time_s and 1 occupancy values: they must pair "
        "up");
  CHECK(error_of("flowtrain_report: 1\nautotune: {overrides: [[a]]}\n") ==
        "r.yaml:2: 'autotune.overrides' must hold strings");
  CHECK(error_of("flowtrain_report: 1\nstages:\n  - name: a\n    drops: [7]\n") ==
        "r.yaml:4: 'stages[0].drops[0]' must be a map");
}

// The report lists the first 100 drops of a stage; metrics.drops (RunOptions::drops_path) lists
// every one, and the report says where.
TEST_CASE("ReportIo.Drops.EveryDroppedItemListedInTheFile" * doctest::timeout(60)) {
  const fs::path dir = fs::temp_directory_path() / "flowtrain_drops_test";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const auto run = [&](std::uint64_t count, const std::string& path) {
    Pipeline p;
    p.add("source", std::make_unique<CountSource<>>(count));
    p.add("filter, odd",
          std::make_unique<ProbeMap<>>(
              [](std::uint64_t&& v, ItemContext& ctx) -> std::optional<std::uint64_t> {
                if (v % 2) return ctx.drop("odd, \"value\" " + std::to_string(v));
                return v;
              }),
          {.concurrency = 2});
    p.add("sink", std::make_unique<ResultSink>());
    return p.run({.threads = 2, .drops_path = path});
  };
  const std::string path = (dir / "drops.csv").string();
  const RunReport r = run(300, path);
  CHECK(r.drops_path == path);
  CHECK(r.stages[1].dropped == 150);
  CHECK(r.stages[1].drops.size() == StageReport::kMaxDropRecords);
  CHECK(format_report(r).find("  ... and 50 more (all in " + path + ")") != std::string::npos);
  const std::vector<CsvRow> rows = read_csv_file(path);
  REQUIRE(rows.size() == 151);
  CHECK(rows[0].fields == std::vector<std::string>{"stage", "item", "reason"});
  std::set<std::uint64_t> items;
  for (std::size_t i = 1; i < rows.size(); ++i) {
    REQUIRE(rows[i].fields.size() == 3);
    CHECK(rows[i].fields[0] == "filter, odd");
    CHECK(rows[i].fields[2] == "odd, \"value\" " + rows[i].fields[1]);
    items.insert(std::stoull(rows[i].fields[1]));
  }
  CHECK(items.size() == 150);
  CHECK(*items.begin() == 1);
  CHECK(*items.rbegin() == 299);

  // Nothing dropped: no file, no path in the report.
  const RunReport none = run(1, path);
  CHECK(none.drops_path.empty());
  CHECK_FALSE(fs::exists(path));
  // A path that cannot be written fails before the run.
  CHECK_THROWS_WITH_AS(run(10, (dir / "no/such/drops.csv").string()),
                       doctest::Contains("cannot write the list of dropped items"), Error);
  fs::remove_all(dir);
}

// The YAML text, byte for byte: report_from_yaml, the files of earlier runs and foodtag's HTML
// report read it, and report_to_json shares the walk over the fields that writes it.
TEST_CASE("ReportIo.Yaml.TextUnchanged") {
  CHECK(report_to_yaml(fixed_report()) == R"(flowtrain_report: 1
wall_s: 12.5
threads: 2
cores: 4
peak_threads: 2
stopped: true
trace_path: runs/1/trace.json
drops_path: ""
key_prefix: phases.distill.
stages:
  - name: source
    kind: source
    concurrency: 1
    max_concurrency: 0
    workers: 1
    queue_capacity: 0
    threads_per_invocation: 1
    intra_op_parallel: false
    item: ""
    items_in: 0
    items_out: 3
    dropped: 0
    drops: []
    busy_s: 0
    busy_fraction: .inf
    starved_fraction: 0
    blocked_fraction: 0
    peak_active: 0
    queue_mean: 0
    queue_max: 0
    queue_series:
      time_s: []
      occupancy: []
    results: []
  - name: "filter: odd"
    kind: map
    concurrency: 2
    max_concurrency: 0
    workers: 2
    queue_capacity: 8
    threads_per_invocation: 1
    intra_op_parallel: true
    item: Batch
    items_in: 3
    items_out: 2
    dropped: 1
    drops:
      - {seq: 1, reason: "odd \"one\" in C:\\data\nline 2\x01"}
    busy_s: 0.30000000000000004
    busy_fraction: .nan
    starved_fraction: 0.3333333333333333
    blocked_fraction: 0
    peak_active: 2
    waiting: {seconds: 0.125, what: a free "buffer", param: pool_size, value: 3, held_after: false, entry_param: true}
    queue_mean: 1.5
    queue_max: 4
    queue_series:
      time_s: [0, 0.5]
      occupancy: [1, 4]
    results:
      - {name: loss, value: -.inf}
      - {name: top1, value: 1e-300}
      - {name: steps, value: 6}
cpu:
  interval_s: 0.25
  process_cpu_s: 1.5
  page_faults: 42
  core_mean: [0.75, 0.0625]
  times_s: [0, 0.25]
  cores:
    - [0.5, 1]
    - [0, 0.125]
autotune:
  tuning_s: 2.5
  tuning_items: 1234
  rehearsal_s: 0.5
  overrides: [phases.distill.threads=3]
  trials:
    - change: start
      layout: 2 graph threads; filter x2
      items_per_s: 412.5
      kept: true
      rehearsal: false
    - change: "'filter' concurrency 2 -> 3"
      layout: 3 graph threads
      items_per_s: 398.25
      kept: false
      rehearsal: true
)");
  const std::string empty = R"(flowtrain_report: 1
wall_s: 0
threads: 0
cores: 0
peak_threads: 0
stopped: false
trace_path: ""
drops_path: ""
key_prefix: ""
stages: []
cpu:
  interval_s: 0
  process_cpu_s: 0
  page_faults: 0
  core_mean: []
  times_s: []
  cores: []
)";
  CHECK(report_to_yaml(RunReport{}) == empty);
  RunReport tuned_nothing;
  tuned_nothing.autotune.emplace();
  CHECK(report_to_yaml(tuned_nothing) == empty + R"(autotune:
  tuning_s: 0
  tuning_items: 0
  rehearsal_s: 0
  overrides: []
  trials:
    []
)");
}

TEST_CASE("ReportIo.Json.PythonReadsEveryField" * doctest::timeout(60)) {
  const RunReport r = fixed_report();
  const std::string json = report_to_json(r);
  CHECK(json.find('\n') == json.size() - 1);  // one line
  const std::string stage_keys =
      "name,kind,concurrency,max_concurrency,workers,queue_capacity,threads_per_invocation,"
      "intra_op_parallel,item,items_in,items_out,dropped,drops,busy_s,busy_fraction,starved_fraction,blocked_fraction,"
      "peak_active,";
  const std::vector<std::pair<std::string, std::string>> texts = {
      {"",
       "flowtrain_report,wall_s,threads,cores,peak_threads,stopped,trace_path,drops_path,"
       "key_prefix,stages,cpu,autotune,verdict"},
      {"stages/0", stage_keys + "queue_mean,queue_max,queue_series,results"},  // no wait
      {"stages/1", stage_keys + "waiting,queue_mean,queue_max,queue_series,results"},
      {"stages/1/waiting", "seconds,what,param,value,held_after,entry_param"},
      {"cpu", "interval_s,process_cpu_s,page_faults,core_mean,times_s,cores"},
      {"autotune", "tuning_s,tuning_items,rehearsal_s,overrides,trials"},
      {"autotune/trials/1", "change,layout,items_per_s,kept,rehearsal"},
      // A quote, a backslash, a newline and a control character, read back as they were.
      {"stages/1/drops/0/reason", "odd \"one\" in C:\\data\nline 2\x01"},
      {"stages/1/drops/0/seq", "1"},
      {"stages/1/name", "filter: odd"},
      {"verdict", r.verdict()},
      {"stages/0/busy_fraction", "null"},    // inf
      {"stages/1/busy_fraction", "null"},    // nan
      {"stages/1/results/0/value", "null"},  // -inf
      {"stages/1/results/2/name", "steps"},
      {"stages/1/results/2/value", "6"},
      {"stopped", "true"},
      {"stages/1/waiting/held_after", "false"},
      {"stages/1/waiting/what", "a free \"buffer\""},
      {"cpu/cores/1/1", "0.125"},
      {"stages/1/queue_series/occupancy/1", "4"},
      {"autotune/overrides/0", "phases.distill.threads=3"},
      {"autotune/trials/1/rehearsal", "true"},
      {"drops_path", ""}};
  // Bit for bit.
  const std::vector<std::pair<std::string, double>> numbers = {
      {"stages/1/busy_s", 0.1 + 0.2},
      {"stages/1/starved_fraction", 1.0 / 3},
      {"stages/1/results/1/value", 1e-300}};
  std::vector<std::string> paths;
  for (const auto& [path, text] : texts) paths.push_back(path);
  for (const auto& [path, number] : numbers) paths.push_back(path);
  const std::vector<std::string> values = python_json(json, paths);
  for (std::size_t i = 0; i < texts.size(); ++i) {
    CAPTURE(texts[i].first);
    CHECK(values[i] == texts[i].second);
  }
  for (std::size_t i = 0; i < numbers.size(); ++i) {
    CAPTURE(numbers[i].first);
    CHECK(std::strtod(values[texts.size() + i].c_str(), nullptr) == numbers[i].second);
  }

  // An empty report: empty lists, no autotune.
  CHECK(python_json(report_to_json(RunReport{}), {"", "stages", "verdict"}) ==
        std::vector<std::string>{"flowtrain_report,wall_s,threads,cores,peak_threads,stopped,"
                                 "trace_path,drops_path,key_prefix,stages,cpu,verdict",
                                 "0", "no stage did any work"});
}

TEST_CASE("ReportIo.Json.RunOfPhases" * doctest::timeout(60)) {
  RunReport single = fixed_report();
  single.key_prefix = "";  // a config of one pipeline
  const std::vector<RunReport> phases = {fixed_report(), single};
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"", "flowtrain_report,config,overrides,stopped,phases"},
      {"config", "runs/kd.yaml"},
      {"overrides", "2"},
      {"overrides/1", "phases.distill.name=\"x\""},
      {"stopped", "SIGINT during phase distill"},
      {"phases", "2"},
      {"phases/0/phase", "distill"},
      {"phases/1/phase", "null"},
      {"phases/0/stages/1/drops/0/reason", "odd \"one\" in C:\\data\nline 2\x01"},
      {"phases/1/verdict", single.verdict()}};
  std::vector<std::string> paths;
  for (const auto& [path, text] : expected) paths.push_back(path);
  const std::vector<std::string> values =
      python_json(run_report_json(phases, {"runs/kd.yaml",
                                           {"threads=1", "phases.distill.name=\"x\""},
                                           "SIGINT during phase distill"}),
                  paths);
  for (std::size_t i = 0; i < expected.size(); ++i) {
    CAPTURE(expected[i].first);
    CHECK(values[i] == expected[i].second);
  }
  // A phase's fields are report_to_json's, the phase's name in place of the marker.
  const std::string keys = python_json(report_to_json(single), {""})[0];
  CHECK(python_json(run_report_json(phases, {}), {"phases/1"})[0] ==
        "phase" + keys.substr(std::string("flowtrain_report").size()));
  CHECK(python_json(run_report_json({}, {"c.yaml", {}, ""}), {"stopped", "phases", "overrides"}) ==
        std::vector<std::string>{"null", "0", "0"});
}
