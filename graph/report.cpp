#include "graph/report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "graph/names.hpp"

namespace flowtrain {

std::string count_text(std::size_t n, const char* noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

namespace {
// Below this busy fraction no stage is called a bottleneck.
constexpr double kSaturated = 0.5;
// Above this share of the graph threads' time, summed over the stages, the threads are.
constexpr double kThreadsSaturated = 0.85;

std::string percent(double fraction) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%.0f%%", fraction * 100);
  return buf;
}

std::string workers_text(const StageReport& s) { return count_text(s.workers, "worker"); }

// "core 0 93%, core 1 88% (this process 1.78 CPU-s per wall-s, 120 page faults a second)"
std::string cpu_text(const RunReport& r) {
  std::string line;
  for (std::size_t c = 0; c < r.cpu.core_mean.size(); ++c) {
    line += (c ? ", core " : "core ") + std::to_string(c) + " " + percent(r.cpu.core_mean[c]);
  }
  if (r.wall_s > 0) {
    char buf[128];
    std::snprintf(buf, sizeof buf,
                  " (this process %.2f CPU-s per wall-s, %.0f page faults a second)",
                  r.cpu.process_cpu_s / r.wall_s,
                  static_cast<double>(r.cpu.page_faults) / r.wall_s);
    line += buf;
  }
  return line;
}
}  // namespace

std::optional<std::size_t> RunReport::bottleneck() const {
  std::optional<std::size_t> best;
  for (std::size_t i = 0; i < stages.size(); ++i) {
    if (stages[i].busy_s <= 0) continue;
    if (!best || stages[i].busy_fraction > stages[*best].busy_fraction) best = i;
  }
  return best;
}

std::string RunReport::verdict() const {
  std::string line = bottleneck_verdict();
  // Each model stage's rate against the one this CPU measured for its products (its results
  // gflops and matrix_rate_gflops).
  std::string rates;
  for (const StageReport& s : stages) {
    double gflops = 0, ceiling = 0;
    for (const StageResult& r : s.results) {
      if (r.name == "gflops") gflops = r.value;
      if (r.name == "matrix_rate_gflops") ceiling = r.value;
    }
    if (gflops <= 0 || ceiling <= 0) continue;
    char text[160];
    std::snprintf(text, sizeof text, "'%s' at %.0f%% (%.0f of %.0f GFLOP/s)", s.name.c_str(),
                  100 * gflops / ceiling, gflops, ceiling);
    rates += (rates.empty() ? "" : ", ") + std::string(text);
  }
  if (rates.empty()) return line;
  return line + "; models against this CPU's measured matrix product rate: " + rates;
}

std::string RunReport::bottleneck_verdict() const {
  const std::optional<std::size_t> b = bottleneck();
  if (!b) return "no stage did any work";
  const StageReport& s = stages[*b];
  if (s.busy_fraction < kSaturated) {
    // The stages together may still keep every graph thread busy: they take turns on them.
    double busy_s = 0;
    for (const StageReport& stage : stages) busy_s += stage.busy_s;
    const double threads_busy = threads > 0 && wall_s > 0 ? busy_s / (wall_s * threads) : 0;
    if (threads_busy >= kThreadsSaturated) {
      return "the " + count_text(threads, "graph thread") + (threads == 1 ? " is" : " are") +
             " the bottleneck: busy " + percent(std::min(threads_busy, 1.0)) +
             " of the run with the stages' work together (the busiest, '" + s.name + "', " +
             percent(s.busy_fraction) + " of its " + workers_text(s) +
             "): the stages wait for a thread, not for each other: raise " + key_prefix +
             "threads (now " + std::to_string(threads) +
             ") within the cores, or make the stages cheaper";
    }
    return "no stage is saturated; the busiest is '" + s.name + "' at " + percent(s.busy_fraction) +
           " of its " + workers_text(s) +
           " (the run is short, or bound by something outside the stages)";
  }
  std::string line = "'" + s.name + "' is the bottleneck: busy " + percent(s.busy_fraction) +
                     " of its " + workers_text(s);
  // What it waited for, and the param that sets how much of it there is, as the config spells
  // it (a node an entry brought has its entry's params).
  const StageWait& w = s.waiting;
  const auto wait_param = [&] {
    char value[32];
    std::snprintf(value, sizeof value, "%g", w.value);
    const std::string owner(w.entry_param ? entry_of(s.name) : s.name);
    return key_prefix + "stages." + owner + ".params." + w.param + " (now " + value + ")";
  };
  if (w.seconds > 0.5 * s.busy_s && w.param.empty()) {
    // It waits for what takes its items outside the graph (a Python loop): the graph keeps up.
    return "the graph waits for " + w.what + ": '" + s.name + "' spent " +
           percent(w.seconds / s.busy_s) +
           " of its time waiting for them; the graph is not what holds the run back";
  }
  if (w.seconds > 0.5 * s.busy_s) {
    // Not work: the items after it, or its peers, hold what it needs to go on.
    return line + ", but " + percent(w.seconds / s.busy_s) + " of that waiting for " + w.what +
           (w.held_after ? ", which the items after it hold" : "") + ": raise " + wait_param() +
           (w.held_after ? ", or lower the queue capacities after it" : "");
  }
  if (w.seconds > 0 && !w.held_after && !w.param.empty()) {
    // A smaller wait on its peers (a pipeline partition's bubble): the param that shrinks it
    // is the advice, not the threads (the peers need a graph thread each).
    return line + ", " + percent(w.seconds / s.busy_s) + " of that waiting for " + w.what +
           ": make each item cheaper, or raise " + wait_param() + " to shrink the wait";
  }
  // Name the costliest stage downstream, which waits on it, to show what the bottleneck costs.
  const StageReport* waiter = nullptr;
  for (std::size_t i = *b + 1; i < stages.size(); ++i) {
    if (!waiter || stages[i].busy_s > waiter->busy_s) waiter = &stages[i];
  }
  if (waiter && waiter->busy_fraction < 0.05) waiter = nullptr;  // a writer that barely works
  if (waiter && waiter->starved_fraction >= 0.05) {
    line += ", while '" + waiter->name + "' waits for input " + percent(waiter->starved_fraction) +
            " of the time";
  }
  if (s.max_concurrency == kSerial && s.intra_op_parallel) {
    // A serial compute stage (a training step): its intra-op threads, and the graph threads of
    // the stages that feed it, share the cores. Which split is faster is measured, never
    // guessed: more intra-op threads can starve its feeders.
    line += "; it runs serially by design on " +
            count_text(s.threads_per_invocation, "intra-op thread") + " (" + layout() + ")";
    const bool rehearsed =
        autotune && std::any_of(autotune->trials.begin(), autotune->trials.end(),
                                [](const AutotuneTrial& t) { return t.rehearsal; });
    const bool other_model =
        std::any_of(stages.begin(), stages.end(), [&](const StageReport& other) {
          return &other != &s && other.intra_op_parallel;
        });
    if (rehearsed) {
      line += ": autotune measured its intra-op threads on rehearsals and chose these; make each "
              "item cheaper, or give the run more cores";
    } else if (autotune) {
      line += ": make each item cheaper; autotune kept the fastest layout it tried but did not "
              "rehearse its intra-op threads (a job of several ranks keeps them as configured): "
              "time other " + key_prefix + "stages." + std::string(entry_of(s.name)) +
              ".params.intraop_threads by hand";
    } else if (s.threads_per_invocation < cores) {
      line += ": make each item cheaper, or measure other splits of the cores between its " +
              key_prefix + "stages." + std::string(entry_of(s.name)) +
              ".params.intraop_threads, the graph threads that feed it" +
              (other_model ? " and the other model stages' concurrency" : std::string()) +
              " (" + key_prefix +
              "autotune: true tries them; taking threads from its feeders can make it slower)";
    } else {
      line += ": make each item cheaper, or give the run more cores";
    }
  } else if (s.max_concurrency == kSerial) {
    line += "; it runs serially by design: make each item cheaper";
  } else if (s.concurrency != kUnlimited && s.workers < s.concurrency && *b + 1 < stages.size() &&
             s.workers == stages[*b + 1].queue_capacity) {
    line += "; raise " + key_prefix + "stages." + stages[*b + 1].name + ".queue_capacity (now " +
            std::to_string(stages[*b + 1].queue_capacity) + ") so it can use more workers";
  } else if (s.workers < threads) {
    line += "; raise " + key_prefix + "stages." + s.name + ".concurrency (now " +
            std::to_string(s.workers) + ")";
  } else {
    line += "; it already runs on every graph thread (" + std::to_string(threads) +
            "): make it cheaper or give the run more cores";
  }
  return line;
}

std::string RunReport::layout() const {
  std::string line = count_text(cores, "core") + ": " + count_text(threads, "graph thread");
  for (const StageReport& s : stages) {
    if (s.threads_per_invocation <= 1) continue;
    line += ", '" + s.name + "' " + std::to_string(s.workers) + " x " +
            std::to_string(s.threads_per_invocation) + " intra-op threads";
  }
  return line + "; at most " + count_text(peak_threads, "thread") + " busy at once";
}

const AutotuneTrial* AutotuneReport::chosen() const {
  const auto kept =
      std::find_if(trials.rbegin(), trials.rend(), [](const AutotuneTrial& t) { return t.kept; });
  return kept == trials.rend() ? nullptr : &*kept;
}

std::string format_autotune(const AutotuneReport& a) {
  std::string out;
  char buf[256];
  const auto rehearsals = static_cast<std::size_t>(std::count_if(
      a.trials.begin(), a.trials.end(), [](const AutotuneTrial& t) { return t.rehearsal; }));
  if (rehearsals > 0) {
    std::snprintf(buf, sizeof buf,
                  "autotune: %zu rehearsal(s) in %.1f s before the run, on throwaway copies "
                  "(their updates not committed)",
                  rehearsals, a.rehearsal_s);
    out += buf;
    if (rehearsals < a.trials.size()) {
      std::snprintf(buf, sizeof buf, "; %zu trial(s) in %.1f s on the run's own work",
                    a.trials.size() - rehearsals, a.tuning_s);
      out += buf;
    }
    out += "\n";
  } else {
    std::snprintf(buf, sizeof buf,
                  "autotune: %zu trial(s) in %.1f s, on the run's own work (%llu source items)\n",
                  a.trials.size(), a.tuning_s, static_cast<unsigned long long>(a.tuning_items));
    out += buf;
  }
  out += "  trial    items/s  kept  change\n";
  for (std::size_t i = 0; i < a.trials.size(); ++i) {
    const AutotuneTrial& t = a.trials[i];
    std::snprintf(buf, sizeof buf, "  %5zu %10.1f  %-4s  ", i + 1, t.items_per_s,
                  t.kept ? "yes" : "");
    out += buf + t.change + "\n";
  }
  // Before any trial is kept (the run ended during the first), the start is what ran.
  const AutotuneTrial* chosen = a.chosen();
  if (!chosen && !a.trials.empty()) chosen = &a.trials.front();
  if (chosen) {
    out += "  chosen (trial " + std::to_string(chosen - a.trials.data() + 1) +
           "): " + chosen->layout + "\n";
  }
  if (a.overrides.empty()) {
    out += "  settings: the config's own layout was the fastest tried\n";
  } else {
    out += "  settings:";
    for (const std::string& o : a.overrides) out += " " + o;
    out += "\n";
  }
  return out;
}

std::string format_timeline(const StageReport& stage, int columns) {
  if (stage.timeline.empty()) return "";
  std::uint64_t item = 0;
  for (const TimelineSpan& span : stage.timeline) item = std::max(item, span.item);
  std::vector<std::string> tracks;  // in order of first appearance
  std::vector<const TimelineSpan*> spans;
  double begin = INFINITY, end = -INFINITY;
  for (const TimelineSpan& span : stage.timeline) {
    if (span.item != item) continue;
    spans.push_back(&span);
    begin = std::min(begin, span.begin_s);
    end = std::max(end, span.end_s);
    if (std::find(tracks.begin(), tracks.end(), span.track) == tracks.end()) {
      tracks.push_back(span.track);
    }
  }
  const double wall = end - begin;
  if (!(wall > 0) || columns < 1) return "";
  std::size_t name_width = 0;
  for (const std::string& track : tracks) name_width = std::max(name_width, track.size());
  std::vector<std::string> rows(tracks.size(), std::string(static_cast<std::size_t>(columns), '.'));
  const auto column = [&](double t) {
    return std::clamp(static_cast<int>(std::lround((t - begin) / wall * columns)), 0, columns);
  };
  double busy = 0;
  for (const TimelineSpan* span : spans) {
    busy += span->end_s - span->begin_s;
    std::string& row = rows[static_cast<std::size_t>(
        std::find(tracks.begin(), tracks.end(), span->track) - tracks.begin())];
    const int from = column(span->begin_s), to = std::max(column(span->end_s), from + 1);
    for (int c = from; c < std::min(to, columns); ++c) {
      const auto k = static_cast<std::size_t>(c - from);
      row[static_cast<std::size_t>(c)] = k < span->label.size() ? span->label[k] : '=';
    }
  }
  char buf[160];
  std::snprintf(buf, sizeof buf, "'%s' timeline of item %llu (%.3f s, %s idle):\n",
                stage.name.c_str(), static_cast<unsigned long long>(item), wall,
                percent(1 - busy / (static_cast<double>(tracks.size()) * wall)).c_str());
  std::string out = buf;
  for (std::size_t t = 0; t < tracks.size(); ++t) {
    out += "  " + tracks[t] + std::string(name_width - tracks[t].size() + 2, ' ') + rows[t] + "\n";
  }
  return out;
}

std::string format_report(const RunReport& r) {
  std::string out;
  char buf[512];
  // The name column fits the longest name ("student/checkpoint"), and is at least 16 wide.
  int width = 16;
  for (const StageReport& s : r.stages) width = std::max(width, static_cast<int>(s.name.size()));
  std::snprintf(buf, sizeof buf, "%-*s %-8s %7s %9s %9s %6s %5s %8s %8s %10s %15s\n", width, "stage",
                "kind", "workers", "in", "out", "drop", "busy", "starved", "blocked", "items/s",
                "queue avg/max/cap");
  out += buf;
  for (const StageReport& s : r.stages) {
    // Sources, and a mix of them, are pulled: no input queue.
    const bool pulled = s.kind == StageShape::Kind::kSource || s.kind == StageShape::Kind::kMix;
    const std::uint64_t items = pulled ? s.items_out : s.items_in;
    const double rate = r.wall_s > 0 ? static_cast<double>(items) / r.wall_s : 0;
    std::string queue = "-";
    if (!pulled) {
      std::snprintf(buf, sizeof buf, "%.1f/%.0f/%zu", s.queue_mean, s.queue_max, s.queue_capacity);
      queue = buf;
    }
    std::snprintf(buf, sizeof buf, "%-*s %-8s %7zu %9s %9s %6llu %5s %8s %8s %10.0f %15s\n",
                  width, s.name.c_str(), to_string(s.kind), s.workers,
                  pulled ? "-" : std::to_string(s.items_in).c_str(),
                  s.kind == StageShape::Kind::kSink ? "-" : std::to_string(s.items_out).c_str(),
                  static_cast<unsigned long long>(s.dropped), percent(s.busy_fraction).c_str(),
                  pulled ? "-" : percent(s.starved_fraction).c_str(),
                  s.kind == StageShape::Kind::kSink ? "-" : percent(s.blocked_fraction).c_str(),
                  rate, queue.c_str());
    out += buf;
  }
  std::snprintf(buf, sizeof buf, "wall %.2f s on %s%s\n", r.wall_s,
                count_text(r.threads, "thread").c_str(),
                r.stopped ? "; stopped early on request (SIGINT or SIGTERM): the counts above are what "
                            "was completed"
                          : "");
  out += buf;
  for (const StageReport& s : r.stages) {
    if (s.dropped == 0) continue;
    out += "dropped by '" + s.name + "': " + std::to_string(s.dropped) + " item(s)\n";
    for (const DropRecord& d : s.drops) {
      out += "  item " + std::to_string(d.seq) + ": " + d.reason + "\n";
    }
    if (s.dropped > s.drops.size()) {
      out += "  ... and " + std::to_string(s.dropped - s.drops.size()) + " more " +
             (r.drops_path.empty() ? "(metrics.drops: FILE lists them all)"
                                   : "(all in " + r.drops_path + ")") +
             "\n";
    }
  }
  for (const StageReport& s : r.stages) {
    if (s.results.empty()) continue;
    out += "results of '" + s.name + "':";
    for (const StageResult& result : s.results) {
      std::snprintf(buf, sizeof buf, " %s %.6g", result.name.c_str(), result.value);
      out += buf;
    }
    out += "\n";
  }
  for (const StageReport& s : r.stages) out += format_timeline(s);
  if (!r.cpu.core_mean.empty()) out += "cpu: " + cpu_text(r) + "\n";
  if (r.autotune) out += format_autotune(*r.autotune);
  out += "layout: " + r.layout() + "\n";
  out += "verdict: " + r.verdict() + "\n";
  if (!r.trace_path.empty()) out += "trace: " + r.trace_path + " (open in ui.perfetto.dev)\n";
  return out;
}

}  // namespace flowtrain
