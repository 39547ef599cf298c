#include "graph/report_io.hpp"

#include <yaml-cpp/yaml.h>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "graph/atomic_file.hpp"
#include "graph/error.hpp"

namespace flowtrain {

namespace {

constexpr int kFormatVersion = 1;
constexpr const char* kMarker = "flowtrain_report";

// The shortest text that reads back as the same double (YAML's spelling for inf and nan).
std::string number(double v) {
  if (std::isnan(v)) return ".nan";
  if (std::isinf(v)) return v > 0 ? ".inf" : "-.inf";
  char buf[32];
  const std::to_chars_result r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

void emit_numbers(YAML::Emitter& out, const std::vector<double>& values) {
  out << YAML::Flow << YAML::BeginSeq;
  for (const double v : values) out << number(v);
  out << YAML::EndSeq;
}

using Kind = StageShape::Kind;
const Kind kKinds[] = {Kind::kSource, Kind::kMap,   Kind::kFlatMap, Kind::kSink,
                       Kind::kJoin,   Kind::kRoute, Kind::kMerge,   Kind::kMix};

void emit_results(YAML::Emitter& out, const std::vector<StageResult>& results) {
  if (results.empty()) out << YAML::Flow;  // "[]" on the key's line
  out << YAML::BeginSeq;
  for (const StageResult& r : results) {
    out << YAML::Flow << YAML::BeginMap << YAML::Key << "name" << YAML::Value << r.name << YAML::Key
        << "value" << YAML::Value << number(r.value) << YAML::EndMap;
  }
  out << YAML::EndSeq;
}

void emit_stage(YAML::Emitter& out, const StageReport& s) {
  auto key = [&](const char* name) -> YAML::Emitter& {
    return out << YAML::Key << name << YAML::Value;
  };
  out << YAML::BeginMap;
  key("name") << s.name;
  key("kind") << to_string(s.kind);
  key("concurrency") << s.concurrency;
  key("max_concurrency") << s.max_concurrency;
  key("workers") << s.workers;
  key("queue_capacity") << s.queue_capacity;
  key("threads_per_invocation") << s.threads_per_invocation;
  key("items_in") << s.items_in;
  key("items_out") << s.items_out;
  key("dropped") << s.dropped;
  key("drops");
  if (s.drops.empty()) out << YAML::Flow;
  out << YAML::BeginSeq;
  for (const DropRecord& d : s.drops) {
    out << YAML::Flow << YAML::BeginMap << YAML::Key << "seq" << YAML::Value << d.seq << YAML::Key
        << "reason" << YAML::Value << d.reason << YAML::EndMap;
  }
  out << YAML::EndSeq;
  key("busy_s") << number(s.busy_s);
  key("busy_fraction") << number(s.busy_fraction);
  key("starved_fraction") << number(s.starved_fraction);
  key("blocked_fraction") << number(s.blocked_fraction);
  key("peak_active") << s.peak_active;
  if (s.waiting.seconds > 0) {
    key("waiting") << YAML::Flow << YAML::BeginMap;
    key("seconds") << number(s.waiting.seconds);
    key("what") << s.waiting.what;
    key("param") << s.waiting.param;
    key("value") << number(s.waiting.value);
    key("held_after") << s.waiting.held_after;
    key("entry_param") << s.waiting.entry_param;
    out << YAML::EndMap;
  }
  key("queue_mean") << number(s.queue_mean);
  key("queue_max") << number(s.queue_max);
  std::vector<double> times, occupancy;
  for (const QueueSample& q : s.queue_series) {
    times.push_back(q.time_s);
    occupancy.push_back(q.occupancy);
  }
  key("queue_series") << YAML::BeginMap;
  key("time_s");
  emit_numbers(out, times);
  key("occupancy");
  emit_numbers(out, occupancy);
  out << YAML::EndMap;
  key("results");
  emit_results(out, s.results);
  out << YAML::EndMap;
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
  YAML::Emitter out;
  auto key = [&](const char* name) -> YAML::Emitter& {
    return out << YAML::Key << name << YAML::Value;
  };
  out << YAML::BeginMap;
  key(kMarker) << kFormatVersion;
  key("wall_s") << number(r.wall_s);
  key("threads") << r.threads;
  key("cores") << r.cores;
  key("peak_threads") << r.peak_threads;
  key("stopped") << r.stopped;
  key("trace_path") << r.trace_path;
  key("drops_path") << r.drops_path;
  key("key_prefix") << r.key_prefix;
  key("stages");
  if (r.stages.empty()) out << YAML::Flow;
  out << YAML::BeginSeq;
  for (const StageReport& s : r.stages) emit_stage(out, s);
  out << YAML::EndSeq;
  key("cpu") << YAML::BeginMap;
  key("interval_s") << number(r.cpu.interval_s);
  key("process_cpu_s") << number(r.cpu.process_cpu_s);
  key("page_faults") << r.cpu.page_faults;
  key("core_mean");
  emit_numbers(out, r.cpu.core_mean);
  key("times_s");
  emit_numbers(out, r.cpu.times_s);
  key("cores");
  if (r.cpu.cores.empty()) out << YAML::Flow;
  out << YAML::BeginSeq;
  for (const std::vector<double>& core : r.cpu.cores) emit_numbers(out, core);
  out << YAML::EndSeq;
  out << YAML::EndMap;
  if (r.autotune) {
    const AutotuneReport& a = *r.autotune;
    key("autotune") << YAML::BeginMap;
    key("tuning_s") << number(a.tuning_s);
    key("tuning_items") << a.tuning_items;
    key("rehearsal_s") << number(a.rehearsal_s);
    key("overrides") << YAML::Flow << a.overrides;
    key("trials") << YAML::BeginSeq;
    for (const AutotuneTrial& t : a.trials) {
      out << YAML::BeginMap;
      key("change") << t.change;
      key("layout") << t.layout;
      key("items_per_s") << number(t.items_per_s);
      key("kept") << t.kept;
      key("rehearsal") << t.rehearsal;
      out << YAML::EndMap;
    }
    out << YAML::EndSeq << YAML::EndMap;
  }
  out << YAML::EndMap;
  if (!out.good()) throw Error("cannot write the run report as YAML: " + out.GetLastError());
  return std::string(out.c_str()) + "\n";
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
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw Error("cannot read run report '" + path +
                "': " + (std::filesystem::exists(path) ? "permission denied" : "no such file"));
  }
  std::stringstream text;
  text << in.rdbuf();
  return report_from_yaml(text.str(), path);
}

}  // namespace flowtrain
