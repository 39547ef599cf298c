#include "graph/report_io.hpp"

#include <yaml-cpp/yaml.h>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <type_traits>

#include "graph/atomic_file.hpp"
#include "graph/error.hpp"
#include "graph/json_writer.hpp"
#include "graph/read_file.hpp"

namespace flowtrain {

namespace {

constexpr int kFormatVersion = 1;
constexpr const char* kMarker = "flowtrain_report";

// The shortest text that reads back as the same double (YAML's spelling for inf and nan).
std::string yaml_number(double v) {
  if (std::isnan(v)) return ".nan";
  if (std::isinf(v)) return v > 0 ? ".inf" : "-.inf";
  char buf[32];
  const std::to_chars_result r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

// How a list or map is laid out in YAML: on lines of its own (block) or as [a, b] and {k: v}
// (flow). JSON has one layout.
enum class Layout { kBlock, kFlow };

// An empty list as "[]" on its key's line.
Layout flow_if_empty(bool empty) { return empty ? Layout::kFlow : Layout::kBlock; }

// The two backends of write_fields, the one walk over a report's fields.
class YamlOut {
 public:
  explicit YamlOut(YAML::Emitter& out) : out_(out) {}
  void begin_map(Layout layout = Layout::kBlock) { style(layout) << YAML::BeginMap; }
  void end_map() { out_ << YAML::EndMap; }
  void begin_list(Layout layout = Layout::kBlock) { style(layout) << YAML::BeginSeq; }
  void end_list() { out_ << YAML::EndSeq; }
  void key(const char* name) { out_ << YAML::Key << name << YAML::Value; }
  void text(const std::string& value) { out_ << value; }
  void number(double value) { out_ << yaml_number(value); }
  void count(std::uint64_t value) { out_ << value; }
  void flag(bool value) { out_ << value; }

 private:
  YAML::Emitter& style(Layout layout) {
    return layout == Layout::kFlow ? out_ << YAML::Flow : out_;
  }
  YAML::Emitter& out_;
};

class JsonOut {
 public:
  explicit JsonOut(JsonWriter& out) : out_(out) {}
  void begin_map(Layout = Layout::kBlock) { out_.begin_object(); }
  void end_map() { out_.end_object(); }
  void begin_list(Layout = Layout::kBlock) { out_.begin_array(); }
  void end_list() { out_.end_array(); }
  void key(const char* name) { out_.key(name); }
  void text(const std::string& value) { out_.string(value); }
  void number(double value) { out_.number(value); }
  void count(std::uint64_t value) { out_.integer(value); }
  void flag(bool value) { out_.boolean(value); }

 private:
  JsonWriter& out_;
};

// `name: value`, the value written as its type asks.
template <class Out, class T>
void field(Out& out, const char* name, const T& value) {
  out.key(name);
  if constexpr (std::is_same_v<T, bool>) {
    out.flag(value);
  } else if constexpr (std::is_floating_point_v<T>) {
    out.number(value);
  } else if constexpr (std::is_integral_v<T>) {
    out.count(value);
  } else {
    out.text(value);
  }
}

template <class Out>
void numbers(Out& out, const std::vector<double>& values) {
  out.begin_list(Layout::kFlow);
  for (const double v : values) out.number(v);
  out.end_list();
}

using Kind = StageShape::Kind;
const Kind kKinds[] = {Kind::kSource, Kind::kMap,   Kind::kFlatMap, Kind::kSink,
                       Kind::kJoin,   Kind::kRoute, Kind::kMerge,   Kind::kMix};

template <class Out>
void write_stage(Out& out, const StageReport& s) {
  out.begin_map();
  field(out, "name", s.name);
  field(out, "kind", to_string(s.kind));
  field(out, "concurrency", s.concurrency);
  field(out, "max_concurrency", s.max_concurrency);
  field(out, "workers", s.workers);
  field(out, "queue_capacity", s.queue_capacity);
  field(out, "threads_per_invocation", s.threads_per_invocation);
  field(out, "intra_op_parallel", s.intra_op_parallel);
  field(out, "item", s.item);
  field(out, "items_in", s.items_in);
  field(out, "items_out", s.items_out);
  field(out, "dropped", s.dropped);
  out.key("drops");
  out.begin_list(flow_if_empty(s.drops.empty()));
  for (const DropRecord& d : s.drops) {
    out.begin_map(Layout::kFlow);
    field(out, "seq", d.seq);
    field(out, "reason", d.reason);
    out.end_map();
  }
  out.end_list();
  field(out, "busy_s", s.busy_s);
  field(out, "busy_fraction", s.busy_fraction);
  field(out, "starved_fraction", s.starved_fraction);
  field(out, "blocked_fraction", s.blocked_fraction);
  field(out, "peak_active", s.peak_active);
  if (s.waiting.seconds > 0) {
    out.key("waiting");
    out.begin_map(Layout::kFlow);
    field(out, "seconds", s.waiting.seconds);
    field(out, "what", s.waiting.what);
    field(out, "param", s.waiting.param);
    field(out, "value", s.waiting.value);
    field(out, "held_after", s.waiting.held_after);
    field(out, "entry_param", s.waiting.entry_param);
    out.end_map();
  }
  field(out, "queue_mean", s.queue_mean);
  field(out, "queue_max", s.queue_max);
  std::vector<double> times, occupancy;
  for (const QueueSample& q : s.queue_series) {
    times.push_back(q.time_s);
    occupancy.push_back(q.occupancy);
  }
  out.key("queue_series");
  out.begin_map();
  out.key("time_s");
  numbers(out, times);
  out.key("occupancy");
  numbers(out, occupancy);
  out.end_map();
  out.key("results");
  out.begin_list(flow_if_empty(s.results.empty()));
  for (const StageResult& r : s.results) {
    out.begin_map(Layout::kFlow);
    field(out, "name", r.name);
    field(out, "value", r.value);
    out.end_map();
  }
  out.end_list();
  out.end_map();
}

// The fields of a report after the format marker, in a map the caller has begun: the one list
// of them, for YAML and JSON.
template <class Out>
void write_fields(Out& out, const RunReport& r) {
  field(out, "wall_s", r.wall_s);
  field(out, "threads", r.threads);
  field(out, "cores", r.cores);
  field(out, "peak_threads", r.peak_threads);
  field(out, "stopped", r.stopped);
  field(out, "trace_path", r.trace_path);
  field(out, "drops_path", r.drops_path);
  field(out, "key_prefix", r.key_prefix);
  out.key("stages");
  out.begin_list(flow_if_empty(r.stages.empty()));
  for (const StageReport& s : r.stages) write_stage(out, s);
  out.end_list();
  out.key("cpu");
  out.begin_map();
  field(out, "interval_s", r.cpu.interval_s);
  field(out, "process_cpu_s", r.cpu.process_cpu_s);
  field(out, "page_faults", r.cpu.page_faults);
  out.key("core_mean");
  numbers(out, r.cpu.core_mean);
  out.key("times_s");
  numbers(out, r.cpu.times_s);
  out.key("cores");
  out.begin_list(flow_if_empty(r.cpu.cores.empty()));
  for (const std::vector<double>& core : r.cpu.cores) numbers(out, core);
  out.end_list();
  out.end_map();
  if (r.autotune) {
    const AutotuneReport& a = *r.autotune;
    out.key("autotune");
    out.begin_map();
    field(out, "tuning_s", a.tuning_s);
    field(out, "tuning_items", a.tuning_items);
    field(out, "rehearsal_s", a.rehearsal_s);
    out.key("overrides");
    out.begin_list(Layout::kFlow);
    for (const std::string& o : a.overrides) out.text(o);
    out.end_list();
    out.key("trials");
    out.begin_list();
    for (const AutotuneTrial& t : a.trials) {
      out.begin_map();
      field(out, "change", t.change);
      field(out, "layout", t.layout);
      field(out, "items_per_s", t.items_per_s);
      field(out, "kept", t.kept);
      field(out, "rehearsal", t.rehearsal);
      out.end_map();
    }
    out.end_list();
    out.end_map();
  }
}

// What JSON adds to the fields: the verdict, which a YAML reader gets from RunReport::verdict().
void write_json_fields(JsonOut& out, const RunReport& r) {
  write_fields(out, r);
  field(out, "verdict", r.verdict());
}

// The phase a report is of, from its key_prefix ("phases.distill." -> "distill", as
// load_run_config sets it); empty for a single pipeline.
std::string phase_of(const RunReport& r) {
  const std::string& key = r.key_prefix;
  const std::size_t start = std::strlen("phases.");
  if (key.rfind("phases.", 0) != 0 || key.size() <= start + 1 || key.back() != '.') return "";
  return key.substr(start, key.size() - start - 1);
}

// Reads fields of a parsed report, failing with the origin, line and field name.
class Reader {
 public:
  explicit Reader(std::string origin) : origin_(std::move(origin)) {}

  [[noreturn]] void fail(const YAML::Node& node, const std::string& message) const {
    const bool known = node && !node.Mark().is_null();
    throw Error(origin_ + (known ? ":" + std::to_string(node.Mark().line + 1) : "") + ": " +
                message);
  }

  // Sets `out` from map[key] if present; `what` names the expected type in the message.
  template <class T>
  void field(const YAML::Node& map, const char* key, T& out, const std::string& path) const {
    const YAML::Node node = map[key];
    if (!node) return;
    if (!node.IsScalar()) fail(node, "'" + path + key + "' must be " + type_name<T>());
    try {
      out = node.as<T>();
    } catch (const YAML::Exception&) {
      fail(node,
           "'" + path + key + "' must be " + type_name<T>() + ", got '" + node.Scalar() + "'");
    }
  }

  void numbers(const YAML::Node& map,
               const char* key,
               std::vector<double>& out,
               const std::string& path) const {
    numbers_of(list(map, key, path), out, path + key);
  }

  // The numbers of a sequence node; `name` is its field path.
  void numbers_of(const YAML::Node& seq, std::vector<double>& out, const std::string& name) const {
    if (!seq.IsSequence()) fail(seq, "'" + name + "' must be a list");
    out.clear();
    for (std::size_t i = 0; i < seq.size(); ++i) {
      double v = 0;
      field_at(seq, i, v, name);
      out.push_back(v);
    }
  }

  // map[key] as a sequence (an empty one if absent).
  YAML::Node list(const YAML::Node& map, const char* key, const std::string& path) const {
    const YAML::Node node = map[key];
    if (!node) return YAML::Node(YAML::NodeType::Sequence);
    if (!node.IsSequence()) fail(node, "'" + path + key + "' must be a list");
    return node;
  }

  // map[key] as a map (an empty one if absent).
  YAML::Node map_at(const YAML::Node& map, const char* key, const std::string& path) const {
    const YAML::Node node = map[key];
    if (!node) return YAML::Node(YAML::NodeType::Map);
    if (!node.IsMap()) fail(node, "'" + path + key + "' must be a map");
    return node;
  }

  // A list entry that must be a map.
  YAML::Node entry(const YAML::Node& list, std::size_t i, const std::string& path) const {
    const YAML::Node node = list[i];
    if (!node.IsMap()) fail(node, "'" + path + "[" + std::to_string(i) + "]' must be a map");
    return node;
  }

 private:
  template <class T>
  void field_at(const YAML::Node& list, std::size_t i, T& out, const std::string& path) const {
    const YAML::Node node = list[i];
    const std::string name = path + "[" + std::to_string(i) + "]";
    try {
      if (!node.IsScalar()) throw YAML::Exception(YAML::Mark::null_mark(), "");
      out = node.as<T>();
    } catch (const YAML::Exception&) {
      fail(node, "'" + name + "' must be " + type_name<T>());
    }
  }

  template <class T>
  static const char* type_name() {
    if constexpr (std::is_same_v<T, bool>) {
      return "true or false";
    } else if constexpr (std::is_same_v<T, std::string>) {
      return "a string";
    } else if constexpr (std::is_floating_point_v<T>) {
      return "a number";
    } else {
      return "a whole number >= 0";
    }
  }

  std::string origin_;
};

std::vector<StageResult> read_results(const Reader& in,
                                      const YAML::Node& map,
                                      const std::string& path) {
  std::vector<StageResult> out;
  const YAML::Node list = in.list(map, "results", path);
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string at = path + "results[" + std::to_string(i) + "].";
    const YAML::Node entry = in.entry(list, i, path + "results");
    StageResult r;
    in.field(entry, "name", r.name, at);
    in.field(entry, "value", r.value, at);
    out.push_back(std::move(r));
  }
  return out;
}

StageReport read_stage(const Reader& in, const YAML::Node& map, const std::string& path) {
  StageReport s;
  in.field(map, "name", s.name, path);
  std::string kind = to_string(s.kind);
  in.field(map, "kind", kind, path);
  bool known = false;
  for (const StageShape::Kind k : kKinds) {
    if (kind == to_string(k)) {
      s.kind = k;
      known = true;
    }
  }
  if (!known) {
    std::string kinds;
    for (const Kind k : kKinds) kinds += (kinds.empty() ? "" : ", ") + std::string(to_string(k));
    in.fail(map["kind"], "'" + path + "kind' must be one of " + kinds + ", got '" + kind + "'");
  }
  in.field(map, "concurrency", s.concurrency, path);
  in.field(map, "max_concurrency", s.max_concurrency, path);
  in.field(map, "workers", s.workers, path);
  in.field(map, "queue_capacity", s.queue_capacity, path);
  in.field(map, "threads_per_invocation", s.threads_per_invocation, path);
  in.field(map, "intra_op_parallel", s.intra_op_parallel, path);
  in.field(map, "item", s.item, path);
  in.field(map, "items_in", s.items_in, path);
  in.field(map, "items_out", s.items_out, path);
  in.field(map, "dropped", s.dropped, path);
  const YAML::Node drops = in.list(map, "drops", path);
  for (std::size_t i = 0; i < drops.size(); ++i) {
    const std::string at = path + "drops[" + std::to_string(i) + "].";
    const YAML::Node entry = in.entry(drops, i, path + "drops");
    DropRecord d;
    in.field(entry, "seq", d.seq, at);
    in.field(entry, "reason", d.reason, at);
    s.drops.push_back(std::move(d));
  }
  in.field(map, "busy_s", s.busy_s, path);
  in.field(map, "busy_fraction", s.busy_fraction, path);
  in.field(map, "starved_fraction", s.starved_fraction, path);
  in.field(map, "blocked_fraction", s.blocked_fraction, path);
  in.field(map, "peak_active", s.peak_active, path);
  if (const YAML::Node waiting = map["waiting"]) {
    const std::string at = path + "waiting.";
    in.field(waiting, "seconds", s.waiting.seconds, at);
    in.field(waiting, "what", s.waiting.what, at);
    in.field(waiting, "param", s.waiting.param, at);
    in.field(waiting, "value", s.waiting.value, at);
    if (waiting["held_after"]) in.field(waiting, "held_after", s.waiting.held_after, at);
    if (waiting["entry_param"]) in.field(waiting, "entry_param", s.waiting.entry_param, at);
  }
  in.field(map, "queue_mean", s.queue_mean, path);
  in.field(map, "queue_max", s.queue_max, path);
  const YAML::Node series = in.map_at(map, "queue_series", path);
  std::vector<double> times, occupancy;
  in.numbers(series, "time_s", times, path + "queue_series.");
  in.numbers(series, "occupancy", occupancy, path + "queue_series.");
  if (times.size() != occupancy.size()) {
    in.fail(series, "'" + path + "queue_series' has " + std::to_string(times.size()) +
                        " times but " + std::to_string(occupancy.size()) + " values");
  }
  for (std::size_t i = 0; i < times.size(); ++i) s.queue_series.push_back({times[i], occupancy[i]});
  s.results = read_results(in, map, path);
  return s;
}

CpuReport read_cpu(const Reader& in, const YAML::Node& map) {
  CpuReport cpu;
  const std::string path = "cpu.";
  in.field(map, "interval_s", cpu.interval_s, path);
  in.field(map, "process_cpu_s", cpu.process_cpu_s, path);
  in.field(map, "page_faults", cpu.page_faults, path);
  in.numbers(map, "times_s", cpu.times_s, path);
  in.numbers(map, "core_mean", cpu.core_mean, path);
  const YAML::Node cores = in.list(map, "cores", path);
  for (std::size_t c = 0; c < cores.size(); ++c) {
    std::vector<double> values;
    in.numbers_of(cores[c], values, path + "cores[" + std::to_string(c) + "]");
    cpu.cores.push_back(std::move(values));
  }
  return cpu;
}

}  // namespace

std::string report_to_yaml(const RunReport& r) {
  YAML::Emitter emitter;
  YamlOut out(emitter);
  out.begin_map();
  field(out, kMarker, kFormatVersion);
  write_fields(out, r);
  out.end_map();
  if (!emitter.good()) {
    throw Error("cannot write the run report as YAML: " + emitter.GetLastError());
  }
  return std::string(emitter.c_str()) + "\n";
}

std::string report_to_json(const RunReport& r) {
  JsonWriter json;
  JsonOut out(json);
  out.begin_map();
  field(out, kMarker, kFormatVersion);
  write_json_fields(out, r);
  out.end_map();
  return json.text() + "\n";
}

std::string run_report_json(const std::vector<RunReport>& phases, const RunReportInfo& info) {
  JsonWriter json;
  json.begin_object().key(kMarker).integer(kFormatVersion).key("config").string(info.config);
  json.key("overrides").begin_array();
  for (const std::string& o : info.overrides) json.string(o);
  json.end_array().key("stopped");
  if (info.stopped.empty()) {
    json.null();
  } else {
    json.string(info.stopped);
  }
  json.key("phases").begin_array();
  JsonOut out(json);
  for (const RunReport& r : phases) {
    json.begin_object().key("phase");
    if (const std::string phase = phase_of(r); phase.empty()) {
      json.null();
    } else {
      json.string(phase);
    }
    write_json_fields(out, r);
    json.end_object();
  }
  json.end_array().end_object();
  return json.text() + "\n";
}

RunReport report_from_yaml(const std::string& text, const std::string& origin) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    throw Error(origin + ":" + std::to_string(e.mark.line + 1) +
                ": not a run report: YAML syntax error: " + e.msg);
  }
  const Reader in(origin);
  if (!root.IsMap() || !root[kMarker]) {
    throw Error(origin + ": not a run report (no '" + kMarker + "' key)");
  }
  int version = 0;
  in.field(root, kMarker, version, "");
  if (version != kFormatVersion) {
    in.fail(root[kMarker], "run report format " + std::to_string(version) +
                               " is not the one this build reads (" +
                               std::to_string(kFormatVersion) + ")");
  }
  RunReport r;
  in.field(root, "wall_s", r.wall_s, "");
  in.field(root, "threads", r.threads, "");
  in.field(root, "cores", r.cores, "");
  in.field(root, "peak_threads", r.peak_threads, "");
  in.field(root, "stopped", r.stopped, "");
  in.field(root, "trace_path", r.trace_path, "");
  in.field(root, "drops_path", r.drops_path, "");
  in.field(root, "key_prefix", r.key_prefix, "");
  const YAML::Node stages = in.list(root, "stages", "");
  for (std::size_t i = 0; i < stages.size(); ++i) {
    r.stages.push_back(
        read_stage(in, in.entry(stages, i, "stages"), "stages[" + std::to_string(i) + "]."));
  }
  r.cpu = read_cpu(in, in.map_at(root, "cpu", ""));
  if (root["autotune"]) {
    const YAML::Node map = in.map_at(root, "autotune", "");
    AutotuneReport& a = r.autotune.emplace();
    in.field(map, "tuning_s", a.tuning_s, "autotune.");
    in.field(map, "tuning_items", a.tuning_items, "autotune.");
    in.field(map, "rehearsal_s", a.rehearsal_s, "autotune.");
    const YAML::Node overrides = in.list(map, "overrides", "autotune.");
    for (std::size_t i = 0; i < overrides.size(); ++i) {
      if (!overrides[i].IsScalar()) in.fail(overrides[i], "'autotune.overrides' must hold strings");
      a.overrides.push_back(overrides[i].Scalar());
    }
    const YAML::Node trials = in.list(map, "trials", "autotune.");
    for (std::size_t i = 0; i < trials.size(); ++i) {
      const YAML::Node t = in.entry(trials, i, "autotune.trials");
      const std::string at = "autotune.trials[" + std::to_string(i) + "].";
      AutotuneTrial& trial = a.trials.emplace_back();
      in.field(t, "change", trial.change, at);
      in.field(t, "layout", trial.layout, at);
      in.field(t, "items_per_s", trial.items_per_s, at);
      in.field(t, "kept", trial.kept, at);
      in.field(t, "rehearsal", trial.rehearsal, at);
    }
  }
  return r;
}

void write_report_file(const RunReport& report, const std::string& path) {
  write_file_atomically(path, report_to_yaml(report));
}

RunReport read_report_file(const std::string& path) {
  return report_from_yaml(read_text_file(path, "run report"), path);
}

}  // namespace flowtrain
