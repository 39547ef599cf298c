#include "graph/report_io.hpp"

#include <yaml-cpp/yaml.h>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

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

// How an empty list of maps is written: "[]" on its key's line, or on a line of its own (the
// autotune trials, as reports have always had them).
enum class Empty { kFlow, kBlock };

// The two backends of WriteFields: YAML through yaml-cpp, JSON through JsonWriter.
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

using Kind = StageShape::Kind;
const Kind kKinds[] = {Kind::kSource, Kind::kMap,   Kind::kFlatMap, Kind::kSink,
                       Kind::kJoin,   Kind::kRoute, Kind::kMerge,   Kind::kMix};

// The schema, written once: every field of a report in file order, walked by WriteFields (YAML
// or JSON) and ReadFields alike. `S` and `R` are const when writing.
template <class V, class S>
void stage_fields(V& v, S& s) {
  v.field("name", s.name);
  v.field("kind", s.kind);
  v.field("concurrency", s.concurrency);
  v.field("max_concurrency", s.max_concurrency);
  v.field("workers", s.workers);
  v.field("queue_capacity", s.queue_capacity);
  v.field("threads_per_invocation", s.threads_per_invocation);
  v.field("intra_op_parallel", s.intra_op_parallel);
  v.field("item", s.item);
  v.field("items_in", s.items_in);
  v.field("items_out", s.items_out);
  v.field("dropped", s.dropped);
  v.maps("drops", s.drops, Layout::kFlow, [](V& d, auto& drop) {
    d.field("seq", drop.seq);
    d.field("reason", drop.reason);
  });
  v.field("busy_s", s.busy_s);
  v.field("busy_fraction", s.busy_fraction);
  v.field("starved_fraction", s.starved_fraction);
  v.field("blocked_fraction", s.blocked_fraction);
  v.field("peak_active", s.peak_active);
  v.map_if("waiting", s.waiting.seconds > 0, Layout::kFlow, [&](V& w) {
    w.field("seconds", s.waiting.seconds);
    w.field("what", s.waiting.what);
    w.field("param", s.waiting.param);
    w.field("value", s.waiting.value);
    w.field("held_after", s.waiting.held_after);
    w.field("entry_param", s.waiting.entry_param);
  });
  v.field("queue_mean", s.queue_mean);
  v.field("queue_max", s.queue_max);
  v.map("queue_series", Layout::kBlock, [&](V& q) {
    q.columns(s.queue_series, "time_s", &QueueSample::time_s, "occupancy", &QueueSample::occupancy);
  });
  v.maps("results", s.results, Layout::kFlow, [](V& e, auto& result) {
    e.field("name", result.name);
    e.field("value", result.value);
  });
}

// The fields of a report after the format marker, in a map the caller has begun.
template <class V, class R>
void report_fields(V& v, R& r) {
  v.field("wall_s", r.wall_s);
  v.field("threads", r.threads);
  v.field("cores", r.cores);
  v.field("peak_threads", r.peak_threads);
  v.field("stopped", r.stopped);
  v.field("trace_path", r.trace_path);
  v.field("drops_path", r.drops_path);
  v.field("key_prefix", r.key_prefix);
  v.maps("stages", r.stages, Layout::kBlock, [](V& sv, auto& s) { stage_fields(sv, s); });
  v.map("cpu", Layout::kBlock, [&](V& c) {
    c.field("interval_s", r.cpu.interval_s);
    c.field("process_cpu_s", r.cpu.process_cpu_s);
    c.field("page_faults", r.cpu.page_faults);
    c.numbers("core_mean", r.cpu.core_mean);
    c.numbers("times_s", r.cpu.times_s);
    c.number_lists("cores", r.cpu.cores);
  });
  v.optional("autotune", r.autotune, [](V& a, auto& tune) {
    a.field("tuning_s", tune.tuning_s);
    a.field("tuning_items", tune.tuning_items);
    a.field("rehearsal_s", tune.rehearsal_s);
    a.texts("overrides", tune.overrides);
    a.maps(
        "trials", tune.trials, Layout::kBlock,
        [](V& t, auto& trial) {
          t.field("change", trial.change);
          t.field("layout", trial.layout);
          t.field("items_per_s", trial.items_per_s);
          t.field("kept", trial.kept);
          t.field("rehearsal", trial.rehearsal);
        },
        Empty::kBlock);
  });
}

// Writes the schema's fields through `Out` (YamlOut or JsonOut).
template <class Out>
class WriteFields {
 public:
  explicit WriteFields(Out& out) : out_(out) {}

  template <class T>
  void field(const char* key, const T& value) {
    out_.key(key);
    if constexpr (std::is_same_v<T, Kind>) {
      out_.text(to_string(value));
    } else if constexpr (std::is_same_v<T, bool>) {
      out_.flag(value);
    } else if constexpr (std::is_floating_point_v<T>) {
      out_.number(value);
    } else if constexpr (std::is_integral_v<T>) {
      out_.count(value);
    } else {
      out_.text(value);
    }
  }
  void numbers(const char* key, const std::vector<double>& values) {
    out_.key(key);
    number_list(values);
  }
  void number_lists(const char* key, const std::vector<std::vector<double>>& lists) {
    out_.key(key);
    out_.begin_list(flow_if_empty(lists.empty()));
    for (const std::vector<double>& values : lists) number_list(values);
    out_.end_list();
  }
  void texts(const char* key, const std::vector<std::string>& values) {
    out_.key(key);
    out_.begin_list(Layout::kFlow);
    for (const std::string& v : values) out_.text(v);
    out_.end_list();
  }
  template <class F>
  void map(const char* key, Layout layout, F&& fields) {
    out_.key(key);
    out_.begin_map(layout);
    fields(*this);
    out_.end_map();
  }
  // A map written only when `write` (a reader takes it when present).
  template <class F>
  void map_if(const char* key, bool write, Layout layout, F&& fields) {
    if (write) map(key, layout, fields);
  }
  template <class T, class F>
  void optional(const char* key, const std::optional<T>& value, F&& fields) {
    if (value) map(key, Layout::kBlock, [&](WriteFields& w) { fields(w, *value); });
  }
  // A list of maps, each laid out as `item_layout`.
  template <class T, class F>
  void maps(const char* key,
            const std::vector<T>& items,
            Layout item_layout,
            F&& fields,
            Empty empty = Empty::kFlow) {
    out_.key(key);
    out_.begin_list(empty == Empty::kFlow ? flow_if_empty(items.empty()) : Layout::kBlock);
    for (const T& item : items) {
      out_.begin_map(item_layout);
      fields(*this, item);
      out_.end_map();
    }
    out_.end_list();
  }
  // Rows of two numbers as two lists of the same length.
  template <class T>
  void columns(
      const std::vector<T>& rows, const char* a, double T::*ma, const char* b, double T::*mb) {
    std::vector<double> first, second;
    for (const T& row : rows) {
      first.push_back(row.*ma);
      second.push_back(row.*mb);
    }
    numbers(a, first);
    numbers(b, second);
  }

 private:
  void number_list(const std::vector<double>& values) {
    out_.begin_list(Layout::kFlow);
    for (const double v : values) out_.number(v);
    out_.end_list();
  }
  Out& out_;
};

// What JSON adds to the fields: the verdict, which a YAML reader gets from RunReport::verdict().
void write_json_fields(JsonOut& out, const RunReport& r) {
  WriteFields<JsonOut> fields(out);
  report_fields(fields, r);
  fields.field("verdict", r.verdict());
}

// The phase a report is of, from its key_prefix ("phases.distill." -> "distill", as
// load_run_config sets it); empty for a single pipeline.
std::string phase_of(const RunReport& r) {
  const std::string& key = r.key_prefix;
  const std::size_t start = std::strlen("phases.");
  if (key.rfind("phases.", 0) != 0 || key.size() <= start + 1 || key.back() != '.') return "";
  return key.substr(start, key.size() - start - 1);
}

// Reads the schema's fields of one map of a parsed report. Errors name the origin, the line and
// the field's path (`path` names this map: "stages[2]."). A field the map lacks keeps its
// default.
class ReadFields {
 public:
  ReadFields(const std::string& origin, YAML::Node map, std::string path)
      : origin_(origin), map_(std::move(map)), path_(std::move(path)) {}

  [[noreturn]] void fail(const YAML::Node& node, const std::string& message) const {
    const bool known = node && !node.Mark().is_null();
    throw Error(origin_ + (known ? ":" + std::to_string(node.Mark().line + 1) : "") + ": " +
                message);
  }

  template <class T>
  void field(const char* key, T& out) const {
    if constexpr (std::is_same_v<T, Kind>) {
      std::string kind = to_string(out);
      scalar(key, kind);
      for (const Kind k : kKinds) {
        if (kind == to_string(k)) {
          out = k;
          return;
        }
      }
      std::string kinds;
      for (const Kind k : kKinds) kinds += (kinds.empty() ? "" : ", ") + std::string(to_string(k));
      fail(map_[key], "'" + path_ + key + "' must be one of " + kinds + ", got '" + kind + "'");
    } else {
      scalar(key, out);
    }
  }
  void numbers(const char* key, std::vector<double>& out) const {
    numbers_of(list(key), out, path_ + key);
  }
  void number_lists(const char* key, std::vector<std::vector<double>>& out) const {
    const YAML::Node seq = list(key);
    out.clear();
    for (std::size_t i = 0; i < seq.size(); ++i) {
      numbers_of(seq[i], out.emplace_back(), path_ + key + "[" + std::to_string(i) + "]");
    }
  }
  void texts(const char* key, std::vector<std::string>& out) const {
    const YAML::Node seq = list(key);
    out.clear();
    for (std::size_t i = 0; i < seq.size(); ++i) {
      if (!seq[i].IsScalar()) fail(seq[i], "'" + path_ + key + "' must hold strings");
      out.push_back(seq[i].Scalar());
    }
  }
  template <class F>
  void map(const char* key, Layout, F&& fields) const {
    ReadFields sub(origin_, map_at(key), path_ + key + ".");
    fields(sub);
  }
  template <class F>
  void map_if(const char* key, bool, Layout layout, F&& fields) const {
    if (map_[key]) map(key, layout, fields);
  }
  template <class T, class F>
  void optional(const char* key, std::optional<T>& value, F&& fields) const {
    if (!map_[key]) return;
    T& v = value.emplace();
    map(key, Layout::kBlock, [&](ReadFields& r) { fields(r, v); });
  }
  template <class T, class F>
  void maps(
      const char* key, std::vector<T>& items, Layout, F&& fields, Empty = Empty::kFlow) const {
    const YAML::Node seq = list(key);
    items.clear();
    for (std::size_t i = 0; i < seq.size(); ++i) {
      const std::string at = path_ + key + "[" + std::to_string(i) + "]";
      if (!seq[i].IsMap()) fail(seq[i], "'" + at + "' must be a map");
      ReadFields item(origin_, seq[i], at + ".");
      fields(item, items.emplace_back());
    }
  }
  template <class T>
  void columns(
      std::vector<T>& rows, const char* a, double T::*ma, const char* b, double T::*mb) const {
    std::vector<double> first, second;
    numbers(a, first);
    numbers(b, second);
    if (first.size() != second.size()) {
      fail(map_, "'" + path_.substr(0, path_.size() - 1) + "' has " + std::to_string(first.size()) +
                     " " + a + " and " + std::to_string(second.size()) + " " + b +
                     " values: they must pair up");
    }
    rows.assign(first.size(), T{});
    for (std::size_t i = 0; i < first.size(); ++i) {
      rows[i].*ma = first[i];
      rows[i].*mb = second[i];
    }
  }

 private:
  // Sets `out` from map[key] if present.
  template <class T>
  void scalar(const char* key, T& out) const {
    const YAML::Node node = map_[key];
    if (!node) return;
    if (!node.IsScalar()) fail(node, "'" + path_ + key + "' must be " + type_name<T>());
    try {
      out = node.as<T>();
    } catch (const YAML::Exception&) {
      fail(node,
           "'" + path_ + key + "' must be " + type_name<T>() + ", got '" + node.Scalar() + "'");
    }
  }

  // The numbers of a sequence node; `name` is its field path.
  void numbers_of(const YAML::Node& seq, std::vector<double>& out, const std::string& name) const {
    if (!seq.IsSequence()) fail(seq, "'" + name + "' must be a list");
    out.clear();
    for (std::size_t i = 0; i < seq.size(); ++i) {
      const YAML::Node node = seq[i];
      double v = 0;
      try {
        if (!node.IsScalar()) throw YAML::Exception(YAML::Mark::null_mark(), "");
        v = node.as<double>();
      } catch (const YAML::Exception&) {
        fail(node, "'" + name + "[" + std::to_string(i) + "]' must be " + type_name<double>());
      }
      out.push_back(v);
    }
  }

  // map[key] as a sequence (an empty one if absent).
  YAML::Node list(const char* key) const {
    const YAML::Node node = map_[key];
    if (!node) return YAML::Node(YAML::NodeType::Sequence);
    if (!node.IsSequence()) fail(node, "'" + path_ + key + "' must be a list");
    return node;
  }

  // map[key] as a map (an empty one if absent).
  YAML::Node map_at(const char* key) const {
    const YAML::Node node = map_[key];
    if (!node) return YAML::Node(YAML::NodeType::Map);
    if (!node.IsMap()) fail(node, "'" + path_ + key + "' must be a map");
    return node;
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

  const std::string& origin_;
  YAML::Node map_;
  std::string path_;
};

}  // namespace

std::string report_to_yaml(const RunReport& r) {
  YAML::Emitter emitter;
  YamlOut out(emitter);
  WriteFields<YamlOut> fields(out);
  out.begin_map();
  fields.field(kMarker, kFormatVersion);
  report_fields(fields, r);
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
  WriteFields<JsonOut>(out).field(kMarker, kFormatVersion);
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
  if (!root.IsMap() || !root[kMarker]) {
    throw Error(origin + ": not a run report (no '" + kMarker + "' key)");
  }
  ReadFields fields(origin, root, "");
  int version = 0;
  fields.field(kMarker, version);
  if (version != kFormatVersion) {
    fields.fail(root[kMarker], "run report format " + std::to_string(version) +
                                   " is not the one this build reads (" +
                                   std::to_string(kFormatVersion) + ")");
  }
  RunReport r;
  report_fields(fields, r);
  return r;
}

void write_report_file(const RunReport& report, const std::string& path) {
  write_file_atomically(path, report_to_yaml(report));
}

RunReport read_report_file(const std::string& path) {
  return report_from_yaml(read_text_file(path, "run report"), path);
}

}  // namespace flowtrain
