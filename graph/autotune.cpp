#include "graph/autotune.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <map>
#include <mutex>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>

#include "graph/atomic_file.hpp"
#include "graph/config.hpp"
#include "graph/error.hpp"
#include "graph/freed_memory.hpp"
#include "graph/names.hpp"

namespace flowtrain {

namespace {

using Kind = StageShape::Kind;
using Clock = std::chrono::steady_clock;

// What the tuner may change of one stage, in a layout.
struct Knobs {
  std::size_t concurrency = 1;
  std::size_t queue_capacity = 1;
  std::size_t threads = 1;  // intra-op threads of one invocation
  bool operator==(const Knobs&) const = default;
};

// A layout: the graph threads and every stage's knobs, in pipeline order.
struct Layout {
  std::size_t threads = 1;
  std::vector<Knobs> stages;
  bool operator==(const Layout&) const = default;
};

// What a trial measured of each stage, for the next round's candidates: its busy share per
// worker, and its share of time blocked on a full output queue.
struct Load {
  std::vector<double> busy;
  std::vector<double> blocked;
};

// The deepest queue the tuner sets (each raise multiplies by 4).
constexpr std::size_t kMaxQueue = 1024;

// This process's resident memory in MB (/proc/self/statm), 0 where unknown.
double resident_mb() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  unsigned long long size = 0, resident = 0;
  const int read = std::fscanf(f, "%llu %llu", &size, &resident);
  std::fclose(f);
  return read == 2
             ? static_cast<double>(resident) * static_cast<double>(::sysconf(_SC_PAGESIZE)) / 1e6
             : 0;
}

// Which knobs of a stage the tuner may turn (the same in every layout).
struct Tunable {
  bool entry = false;         // a config entry (not a node it expands into): its keys can be set
  bool stage = false;         // an entry, not a source or sink
  bool threads = false;       // accepts new intra-op threads between runs
  std::string threads_param;  // the config param that sets them
};

// Completions a trial's window measures at least, after the first (a slow training step
// may take a second: a short window would judge it on one or two).
constexpr std::uint64_t kMinCompletions = 4;

class Tuner {
 public:
  Tuner(Pipeline& pipeline, const RunOptions& options, const std::vector<StageDecl>& config_decls)
      : pipeline_(pipeline),
        options_(options),
        decls_(pipeline.decls()),
        baseline_mb_(resident_mb()) {
    start_.threads = options.threads;  // 0 (the default) until the first trial says
    for (const StageDecl& d : decls_) {
      start_.stages.push_back(
          {d.options.concurrency, d.options.queue_capacity, d.threads_per_invocation});
      const auto declared = std::find_if(config_decls.begin(), config_decls.end(),
                                         [&](const StageDecl& c) { return c.name == d.name; });
      const Kind kind = d.shape.kind;
      Tunable t;
      t.entry = declared != config_decls.end() && entry_of(d.name) == d.name;
      t.stage = t.entry && kind != Kind::kSource && kind != Kind::kMix && kind != Kind::kSink &&
                kind != Kind::kMerge && d.options.concurrency != kUnlimited;
      if (t.stage && !declared->threads_param.empty()) {
        t.threads_param = declared->threads_param;
        // Asking for the count it has tells whether it takes another, and changes nothing.
        t.threads = pipeline.set_threads_per_invocation(d.name, d.threads_per_invocation);
      }
      t.stage = t.stage && (d.shape.max_concurrency != kSerial || t.threads);
      tunable_.push_back(t);
    }
  }

  // A rehearsal compares thread counts only (the run tries deeper queues on its own work),
  // and throws its work in flight away at each pause.
  void set_rehearsal(bool rehearsal) { rehearsal_ = rehearsal; }

  // The outcome of a search: the fastest layout tried, its rate, and the last trial's report.
  struct Search {
    Layout best;
    double rate = 0;
    RunReport report;  // `paused` unless the run ended (its data, or a signal) during a trial
  };

  // Hill-climbs from the starting layout for at most `budget` trials, adding them to `tuning`.
  Search search(std::size_t budget, AutotuneReport& tuning) {
    const std::size_t first = tuning.trials.size();
    Search out{start_, 0, {}};
    std::vector<double> busy(decls_.size(), 0.0);  // each stage's busy seconds so far
    double wall = 0;
    Load load;  // the best layout's
    std::vector<Layout> tried;
    std::vector<std::pair<Layout, std::string>> round = {{start_, "start"}};
    RunReport& report = out.report;
    const auto trials = [&] { return tuning.trials.size() - first; };
    while (!round.empty()) {
      std::optional<std::size_t> winner;  // in `round`
      std::size_t winner_trial = 0;       // in tuning.trials
      double winner_rate = 0;
      Load winner_load;
      for (std::size_t c = 0; c < round.size(); ++c) {
        if (trials() >= budget) break;
        Layout& layout = round[c].first;
        double rate = 0, peak_mb = 0;
        report = trial(layout, rate, peak_mb);
        if (trials() == 0) {  // what the pipeline resolved `threads: 0` and `cores` to
          cores_ = report.cores;
          layout.threads = start_.threads = report.threads;
        }
        tried.push_back(layout);
        // Each stage's share of its workers' time in this trial alone (busy), and of its
        // time blocked on a full output queue (sampled per run, so this trial's).
        const double trial_wall = report.wall_s - wall;
        Load share{std::vector<double>(decls_.size(), 0.0),
                   std::vector<double>(decls_.size(), 0.0)};
        for (std::size_t i = 0; i < report.stages.size(); ++i) {
          const StageReport& s = report.stages[i];
          if (trial_wall > 0 && s.workers > 0) {
            share.busy[i] = (s.busy_s - busy[i]) / (trial_wall * static_cast<double>(s.workers));
          }
          busy[i] = s.busy_s;
          share.blocked[i] = s.blocked_fraction;
        }
        wall = report.wall_s;
        // What the trial's queues added to the process's memory, against the budget.
        const double grown_mb = peak_mb - baseline_mb_;
        const bool fits_memory = grown_mb <= options_.autotune.memory_mb;
        tuning.trials.push_back(
            {round[c].second + (fits_memory
                                    ? std::string()
                                    : " (memory +" + std::to_string(static_cast<long>(grown_mb)) +
                                          " MB, over the budget)"),
             describe(layout), rate, false});
        if (!report.paused) break;  // the run ended (its data, or a signal): nothing to tune
        const double bar = (winner ? winner_rate : out.rate) * (1 + options_.autotune.min_gain);
        if (trials() == 1 || (rate > bar && fits_memory)) {
          winner = c;
          winner_trial = tuning.trials.size() - 1;
          winner_rate = rate;
          winner_load = share;
        }
      }
      if (!report.paused || !winner) break;
      out.best = round[*winner].first;
      out.rate = winner_rate;
      load = winner_load;
      tuning.trials[winner_trial].kept = true;
      if (trials() >= budget) break;
      round = candidates(out.best, load, tried);
    }
    return out;
  }

  // Tunes, then runs the rest of the stream on the chosen layout.
  RunReport run() {
    const Clock::time_point begin = Clock::now();
    AutotuneReport tuning;
    Search found = search(options_.autotune.max_trials, tuning);
    tuning.tuning_s = std::chrono::duration<double>(Clock::now() - begin).count();
    tuning.tuning_items = pipeline_.produced();
    tuning.overrides = overrides(found.best);
    RunReport report = std::move(found.report);
    if (report.paused) {
      apply(found.best);
      RunOptions rest = options_;
      rest.threads = found.best.threads;
      report = pipeline_.run(rest);
    }
    report.autotune = std::move(tuning);
    return report;
  }

  // `config` (the phase this pipeline was built from) with `layout`'s graph threads and its
  // entries' concurrency, queue capacity and intra-op threads (nodes an entry expands into
  // keep theirs).
  void set_layout(PipelineConfig& config, const Layout& layout) const {
    config.run.threads = layout.threads;
    for (std::size_t i = 0; i < decls_.size(); ++i) {
      const auto entry =
          std::find_if(config.stages.begin(), config.stages.end(),
                       [&](const StageConfig& s) { return s.name == decls_[i].name; });
      if (entry == config.stages.end()) continue;
      entry->options.concurrency = layout.stages[i].concurrency;
      entry->options.queue_capacity = layout.stages[i].queue_capacity;
      if (tunable_[i].threads) {
        entry->params.set(tunable_[i].threads_param,
                          static_cast<std::int64_t>(layout.stages[i].threads));
      }
    }
  }

 private:
  // Runs `layout` for the warm-up and the measured window, then pauses; `rate` is the last
  // stage's items per second in the window (0 if the run ended first), `peak_mb` the most
  // resident memory seen in it.
  RunReport trial(const Layout& layout, double& rate, double& peak_mb) {
    apply(layout);
    RunOptions run = options_;
    run.threads = layout.threads;
    run.trace_path.clear();  // the trace shows the run after tuning
    std::mutex mutex;
    std::condition_variable wake;
    bool done = false;
    const auto seconds = [](double s) {
      return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
    };
    // The rate is the last stage's, over `trial_s` (and kMinCompletions) from its first
    // completion after the warm-up to its last: queues refilling after the pause do not count
    // (a training phase's first step may come seconds after it), a slow stage (a training
    // step) is not rounded to whole items per window, nor judged on one or two.
    const std::uint64_t before = pipeline_.completed();
    std::thread timer([&] {
      std::unique_lock lock(mutex);
      // The warm-up lasts `warmup_s` and two completions (a model's first calls are slow).
      const auto warm = [&] { return done || pipeline_.completed() >= before + 2; };
      if (wake.wait_for(lock, seconds(options_.autotune.warmup_s), [&] { return done; })) return;
      while (!wake.wait_for(lock, std::chrono::milliseconds(2), warm)) {
      }
      if (done) return;
      std::uint64_t seen = pipeline_.completed(), first = 0, last = 0;
      Clock::time_point first_at, last_at;
      for (std::size_t polls = 0;
           !wake.wait_for(lock, std::chrono::milliseconds(2), [&] { return done; }); ++polls) {
        const Clock::time_point now = Clock::now();
        if (polls % 5 == 0) peak_mb = std::max(peak_mb, resident_mb());
        if (const std::uint64_t n = pipeline_.completed(); n != seen) {
          if (first_at == Clock::time_point()) std::tie(first, first_at) = std::pair(n, now);
          std::tie(last, last_at) = std::pair(n, now);
          seen = n;
        }
        if (last >= first + kMinCompletions &&
            now >= first_at + seconds(options_.autotune.trial_s)) {
          rate = static_cast<double>(last - first) /
                 std::chrono::duration<double>(last_at - first_at).count();
          if (rehearsal_) {
            pipeline_.request_pause_discarding();
          } else {
            pipeline_.request_pause();
          }
          return;
        }
      }
    });
    const auto finish = [&] {
      {
        std::lock_guard lock(mutex);
        done = true;
      }
      wake.notify_all();
      timer.join();
    };
    RunReport report;
    try {
      report = pipeline_.run(run);
    } catch (...) {
      finish();
      throw;
    }
    finish();
    return report;
  }

  void apply(const Layout& layout) {
    for (std::size_t i = 0; i < decls_.size(); ++i) {
      const Knobs& k = layout.stages[i];
      const std::string& name = decls_[i].name;
      const Kind kind = decls_[i].shape.kind;
      // A consumer of a tuned stage (a sink, say) may have had its queue raised.
      if (kind != Kind::kSource && kind != Kind::kMix) {
        pipeline_.set_queue_capacity(name, k.queue_capacity);
      }
      if (!tunable_[i].stage) continue;
      pipeline_.set_concurrency(name, k.concurrency);
      if (tunable_[i].threads) pipeline_.set_threads_per_invocation(name, k.threads);
    }
  }

  bool fits(const Layout& layout) const {
    std::vector<StageDecl> decls = decls_;
    for (std::size_t i = 0; i < decls.size(); ++i) {
      decls[i].options.concurrency = layout.stages[i].concurrency;
      decls[i].options.queue_capacity = layout.stages[i].queue_capacity;
      decls[i].threads_per_invocation = layout.stages[i].threads;
    }
    RunOptions run;
    run.threads = layout.threads;
    run.cores = cores_;
    return thread_budget_problem(decls, run).empty();
  }

  // The next round's layouts: one change each from `best`, for its busiest stages first (by
  // their share of their workers' time), then the graph threads. A change that does not fit
  // the cores takes a thread from elsewhere (the graph, or another stage's intra-op threads).
  std::vector<std::pair<Layout, std::string>> candidates(const Layout& best,
                                                         const Load& load,
                                                         const std::vector<Layout>& tried) const {
    std::vector<std::size_t> order;
    for (std::size_t i = 0; i < decls_.size(); ++i) {
      if (tunable_[i].stage && load.busy[i] > 0.05) order.push_back(i);
    }
    std::sort(order.begin(), order.end(),
              [&](std::size_t a, std::size_t b) { return load.busy[a] > load.busy[b]; });
    if (order.size() > 3) order.resize(3);

    std::vector<std::pair<Layout, std::string>> out;
    const auto add = [&](Layout layout, std::string change) {
      if (!fits(layout)) {
        // Make room: one graph thread fewer, or one intra-op thread fewer for another stage.
        std::vector<std::pair<Layout, std::string>> room;
        if (layout.threads > 1 && layout.threads == best.threads) {
          Layout l = layout;
          --l.threads;
          room.push_back({l, ", graph threads " + std::to_string(best.threads) + " -> " +
                                 std::to_string(l.threads)});
        }
        for (std::size_t j = 0; j < decls_.size(); ++j) {
          const Knobs& k = layout.stages[j];
          if (!tunable_[j].threads || k.threads <= 1 || k.threads != best.stages[j].threads)
            continue;
          Layout l = layout;
          --l.stages[j].threads;
          room.push_back({l, ", '" + decls_[j].name + "' intra-op " + std::to_string(k.threads) +
                                 " -> " + std::to_string(k.threads - 1)});
        }
        const auto fitting =
            std::find_if(room.begin(), room.end(), [&](const auto& r) { return fits(r.first); });
        if (fitting == room.end()) return;
        layout = fitting->first;
        change += fitting->second;
      }
      const bool seen =
          std::find(tried.begin(), tried.end(), layout) != tried.end() ||
          std::any_of(out.begin(), out.end(), [&](const auto& o) { return o.first == layout; });
      if (!seen) out.push_back({std::move(layout), std::move(change)});
    };
    for (const std::size_t i : order) {
      const Knobs& k = best.stages[i];
      const std::string& name = decls_[i].name;
      if (tunable_[i].threads && k.threads < cores_) {
        Layout l = best;
        ++l.stages[i].threads;
        add(l, "'" + name + "' intra-op " + std::to_string(k.threads) + " -> " +
                   std::to_string(k.threads + 1));
      }
      if (decls_[i].shape.max_concurrency != kSerial && k.concurrency < cores_) {
        Layout l = best;
        const std::size_t c = ++l.stages[i].concurrency;
        // Each consumer's queue must hold what the stage's workers may produce at once.
        for (const std::size_t j : consumers_of(decls_, i)) {
          l.stages[j].queue_capacity = std::max(l.stages[j].queue_capacity, c);
        }
        std::string change =
            "'" + name + "' concurrency " + std::to_string(c - 1) + " -> " + std::to_string(c);
        if (c > l.threads) {  // workers beyond the graph threads would never run
          ++l.threads;
          change += ", graph threads " + std::to_string(l.threads - 1) + " -> " +
                    std::to_string(l.threads);
        }
        add(l, change);
      }
      // Its workers wait on full output queues (an ordered consumer waiting for a late item,
      // say): deeper queues for its consumers, within the memory budget. Only entries' queues,
      // which the chosen settings can name.
      if (!rehearsal_ && load.blocked[i] > 0.05) {
        Layout l = best;
        std::string change;
        for (const std::size_t j : consumers_of(decls_, i)) {
          std::size_t& capacity = l.stages[j].queue_capacity;
          if (!tunable_[j].entry || capacity >= kMaxQueue) continue;
          const std::size_t raised = std::min(capacity * 4, kMaxQueue);
          change += std::string(change.empty() ? "" : ", ") + "'" + decls_[j].name + "' queue " +
                    std::to_string(capacity) + " -> " + std::to_string(raised);
          capacity = raised;
        }
        if (!change.empty()) add(l, change);
      }
    }
    if (best.threads < cores_) {
      Layout l = best;
      ++l.threads;
      add(l, "graph threads " + std::to_string(best.threads) + " -> " + std::to_string(l.threads));
    }
    return out;
  }

  std::string describe(const Layout& layout) const {
    std::string text = count_text(layout.threads, "graph thread");
    for (std::size_t i = 0; i < decls_.size(); ++i) {
      const Knobs& k = layout.stages[i];
      if (!tunable_[i].stage) continue;
      text += "; " + decls_[i].name + " x" + std::to_string(k.concurrency);
      if (tunable_[i].threads || k.threads > 1)
        text += " (" + std::to_string(k.threads) + " intra-op)";
    }
    for (std::size_t i = 0; i < decls_.size(); ++i) {  // queues the tuner deepened
      if (layout.stages[i].queue_capacity != start_.stages[i].queue_capacity) {
        text += "; " + decls_[i].name + " queue " + std::to_string(layout.stages[i].queue_capacity);
      }
    }
    return text;
  }

  std::vector<std::string> overrides(const Layout& best) const {
    const std::string& prefix = options_.key_prefix;
    std::vector<std::string> out;
    if (best.threads != start_.threads) {
      out.push_back(prefix + "threads=" + std::to_string(best.threads));
    }
    for (std::size_t i = 0; i < decls_.size(); ++i) {
      const Knobs& a = start_.stages[i];
      const Knobs& b = best.stages[i];
      const std::string key = prefix + "stages." + decls_[i].name + ".";
      if (a.concurrency != b.concurrency) {
        out.push_back(key + "concurrency=" + std::to_string(b.concurrency));
      }
      if (a.queue_capacity != b.queue_capacity) {
        out.push_back(key + "queue_capacity=" + std::to_string(b.queue_capacity));
      }
      if (a.threads != b.threads) {
        out.push_back(key + "params." + tunable_[i].threads_param + "=" +
                      std::to_string(b.threads));
      }
    }
    return out;
  }

  Pipeline& pipeline_;
  const RunOptions& options_;
  const std::vector<StageDecl> decls_;
  std::vector<Tunable> tunable_;  // [i]: of decls_[i]
  std::size_t cores_ = 1;
  Layout start_;
  double baseline_mb_;  // resident memory before the first trial
  bool rehearsal_ = false;
};

// The param that sets an entry's intra-op threads (StageDoc::threads_param; empty: none).
const std::string& threads_param(const StageConfig& stage, const Registry& registry) {
  return registry.find(stage.type)->doc.threads_param;
}

// The changes from `from` to `to` (the same phase, another layout) as overrides with the
// phase's key prefix: graph threads, and each entry's concurrency, queue capacity and threads.
std::vector<std::string> layout_overrides(const PipelineConfig& from,
                                          const PipelineConfig& to,
                                          const Registry& registry) {
  const std::string& prefix = from.run.key_prefix;
  std::vector<std::string> out;
  if (threads_and_cores(from.run).first != threads_and_cores(to.run).first) {
    out.push_back(prefix + "threads=" + std::to_string(threads_and_cores(to.run).first));
  }
  for (std::size_t k = 0; k < from.stages.size(); ++k) {
    const StageConfig& a = from.stages[k];
    const StageConfig& b = to.stages[k];
    const std::string key = prefix + "stages." + a.name + ".";
    if (a.options.concurrency != b.options.concurrency) {
      out.push_back(key + "concurrency=" + std::to_string(b.options.concurrency));
    }
    if (a.options.queue_capacity != b.options.queue_capacity) {
      out.push_back(key + "queue_capacity=" + std::to_string(b.options.queue_capacity));
    }
    const std::string& param = threads_param(a, registry);
    if (!param.empty() && a.params.get_int(param) != b.params.get_int(param)) {
      out.push_back(key + "params." + param + "=" + std::to_string(b.params.get_int(param)));
    }
  }
  return out;
}

// Makes `phase` fit its cores by taking threads from what may give them: the graph threads
// first, then the intra-op threads of the stage with the most among those not in `keep`.
// False if nothing is left to take.
bool make_room(PipelineConfig& phase,
               const std::vector<std::size_t>& keep,
               const Registry& registry) {
  while (!thread_budget_problem(stage_decls(phase, registry), phase.run).empty()) {
    if (const std::size_t threads = threads_and_cores(phase.run).first; threads > 1) {
      phase.run.threads = threads - 1;
      continue;
    }
    StageConfig* most = nullptr;
    std::int64_t most_threads = 1;
    for (std::size_t k = 0; k < phase.stages.size(); ++k) {
      const std::string& param = threads_param(phase.stages[k], registry);
      if (param.empty() || std::find(keep.begin(), keep.end(), k) != keep.end()) continue;
      if (const std::int64_t n = phase.stages[k].params.get_int(param); n > most_threads) {
        most = &phase.stages[k];
        most_threads = n;
      }
    }
    if (most == nullptr) return false;
    most->params.set(threads_param(*most, registry), most_threads - 1);
  }
  return true;
}

}  // namespace

std::optional<AutotuneReport> autotune_rehearse(PipelineConfig& phase,
                                                const BuildContext& context,
                                                const Registry& registry) {
  if (!phase.run.autotune.enabled) return std::nullopt;
  std::vector<std::size_t> fixed;  // entries whose threads change their results
  std::string names;
  for (std::size_t k = 0; k < phase.stages.size(); ++k) {
    const StageDoc& doc = registry.find(phase.stages[k].type)->doc;
    if (!doc.threads_change_results || doc.threads_param.empty()) continue;
    fixed.push_back(k);
    names += (names.empty() ? "'" : ", '") + phase.stages[k].name + "'";
  }
  const std::size_t cores = threads_and_cores(phase.run).second;
  if (fixed.empty() || cores < 2) return std::nullopt;
  // The counts tried: the configured one first, then 1, 2, 4, ... and all the cores.
  const StageConfig& first_fixed = phase.stages[fixed.front()];
  std::vector<std::size_t> counts = {
      static_cast<std::size_t>(first_fixed.params.get_int(threads_param(first_fixed, registry)))};
  for (std::size_t n = 1; n <= cores; n = n * 2 >= cores && n < cores ? cores : n * 2) {
    if (std::find(counts.begin(), counts.end(), n) == counts.end()) counts.push_back(n);
  }
  BuildContext rehearsal = context;
  rehearsal.set_rehearsal(true);
  const Clock::time_point begin = Clock::now();
  // Each count gets a short search (its best layout is found again on the run's own work,
  // with the rest of max_trials, once the count is fixed).
  const std::size_t budget =
      std::max<std::size_t>(3, phase.run.autotune.max_trials / (2 * counts.size()));
  AutotuneReport tuning;
  std::optional<PipelineConfig> best;
  double best_rate = 0;
  std::size_t best_first = 0, best_last = 0;  // its trials, in tuning.trials
  for (const std::size_t n : counts) {
    PipelineConfig copy = phase;
    copy.run.on_progress = nullptr;  // the run's progress is the real run's
    copy.run.drops_path.clear();     // and its files too
    // Half the window: a rehearsal only has to tell the counts apart, and its work is lost.
    copy.run.autotune.trial_s /= 2;
    for (const std::size_t k : fixed) {
      StageConfig& stage = copy.stages[k];
      stage.params.set(threads_param(stage, registry), static_cast<std::int64_t>(n));
      stage.auto_threads = false;
    }
    if (!make_room(copy, fixed, registry)) continue;
    std::unique_ptr<Pipeline> pipeline = build_pipeline(copy, registry, rehearsal);
    const std::size_t first = tuning.trials.size();
    StopOnSignal stop(*pipeline);
    Tuner tuner(*pipeline, copy.run, stage_decls(copy, registry));
    tuner.set_rehearsal(true);
    const Tuner::Search found = tuner.search(budget, tuning);
    if (const int signal = stop.received()) {
      throw Error(std::string("stopped by ") + (signal == SIGTERM ? "SIGTERM" : "SIGINT") +
                  " during autotune's rehearsals (they write nothing)");
    }
    const std::string what = "rehearsal, " + names + " intra-op " + std::to_string(n) + ": ";
    for (std::size_t t = first; t < tuning.trials.size(); ++t) {
      tuning.trials[t].change = what + tuning.trials[t].change;
      tuning.trials[t].rehearsal = true;
    }
    if (!best || found.rate > best_rate) {
      tuner.set_layout(copy, found.best);
      best = std::move(copy);
      best_rate = found.rate;
      std::tie(best_first, best_last) = std::pair(first, tuning.trials.size());
    }
  }
  release_freed_memory();  // the rehearsals' buffers, in arenas the run may never use
  if (!best) return std::nullopt;
  // Only the chosen count's winners stay kept: AutotuneReport::chosen is the last of them.
  for (std::size_t t = 0; t < tuning.trials.size(); ++t) {
    if (t < best_first || t >= best_last) tuning.trials[t].kept = false;
  }
  tuning.overrides = layout_overrides(phase, *best, registry);
  tuning.rehearsal_s = std::chrono::duration<double>(Clock::now() - begin).count();
  phase = std::move(*best);
  return tuning;
}

std::string autotune_yaml(const AutotuneReport& report, const std::string& key_prefix) {
  // "stages.NAME.KEY=V" and "stages.NAME.params.P=V" (Tuner::overrides) gathered per stage.
  constexpr std::string_view kStages = "stages.", kParams = "params.";
  std::string threads;
  std::vector<std::pair<std::string, std::string>> stages;  // name, "{concurrency: 2, ...}" body
  std::map<std::string, std::string> params;
  for (const std::string& o : report.overrides) {
    const std::string key = o.substr(key_prefix.size(), o.find('=') - key_prefix.size());
    const std::string value = o.substr(o.find('=') + 1);
    if (key == "threads") {
      threads = value;
      continue;
    }
    const std::size_t begin = kStages.size();  // "stages.NAME.KEY"
    const std::size_t dot = key.find('.', begin);
    const std::string name = key.substr(begin, dot - begin);
    const std::string rest = key.substr(dot + 1);
    auto it =
        std::find_if(stages.begin(), stages.end(), [&](const auto& s) { return s.first == name; });
    if (it == stages.end()) it = stages.insert(stages.end(), {name, ""});
    if (rest.rfind(kParams, 0) == 0) {
      params[name] +=
          (params[name].empty() ? "" : ", ") + rest.substr(kParams.size()) + ": " + value;
    } else {
      it->second += (it->second.empty() ? "" : ", ") + rest + ": " + value;
    }
  }
  std::string out =
      "# chosen by autotune" +
      (key_prefix.empty() ? std::string() : " for " + key_prefix.substr(0, key_prefix.size() - 1)) +
      ": set these keys (stages by name)\n";
  if (!threads.empty()) out += "threads: " + threads + "\n";
  if (!stages.empty()) out += "stages:\n";
  for (const auto& [name, body] : stages) {
    std::string line = body;
    if (!params[name].empty())
      line += (line.empty() ? "" : ", ") + std::string("params: {") + params[name] + "}";
    out += "  " + name + ": {" + line + "}\n";
  }
  return out;
}

RunReport autotune_run(Pipeline& pipeline,
                       const RunOptions& options,
                       const std::vector<StageDecl>& decls,
                       std::optional<AutotuneReport> rehearsed) {
  if (!options.autotune.enabled) return pipeline.run(options);
  // The trials run without it: a trace that cannot be written fails before them.
  if (!options.trace_path.empty()) check_can_write_atomically(options.trace_path);
  if (!rehearsed) return Tuner(pipeline, options, decls).run();
  // The pipeline was built with the rehearsals' choice; the rest of the trials tune on from it
  // on the run's own work (the step's threads stay).
  const std::size_t used = rehearsed->trials.size();
  if (options.autotune.max_trials < used + 2) {
    RunReport report = pipeline.run(options);
    report.autotune = std::move(rehearsed);
    return report;
  }
  RunOptions rest = options;
  rest.autotune.max_trials -= used;
  RunReport report = Tuner(pipeline, rest, decls).run();
  AutotuneReport& tuned = *report.autotune;
  tuned.trials.insert(tuned.trials.begin(), rehearsed->trials.begin(), rehearsed->trials.end());
  tuned.rehearsal_s = rehearsed->rehearsal_s;
  // The rehearsals' settings, then the run's own on top (the same key: the later value).
  std::vector<std::string> overrides = rehearsed->overrides;
  for (const std::string& o : tuned.overrides) {
    const std::string key = o.substr(0, o.find('=') + 1);
    const auto same = std::find_if(overrides.begin(), overrides.end(),
                                   [&](const std::string& r) { return r.rfind(key, 0) == 0; });
    if (same != overrides.end()) {
      *same = o;
    } else {
      overrides.push_back(o);
    }
  }
  tuned.overrides = std::move(overrides);
  return report;
}

}  // namespace flowtrain
