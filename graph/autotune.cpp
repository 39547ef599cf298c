#include "graph/autotune.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>

#include "graph/error.hpp"

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

// Which knobs of a stage the tuner may turn (the same in every layout).
struct Tunable {
  bool stage = false;         // a config entry (not an expansion), not a source or sink
  bool threads = false;       // accepts new intra-op threads between runs
  std::string threads_param;  // the config param that sets them
};

class Tuner {
 public:
  Tuner(Pipeline& pipeline, const RunOptions& options, const std::vector<StageDecl>& config_decls)
      : pipeline_(pipeline), options_(options), decls_(pipeline.decls()) {
    start_.threads = options.threads;  // 0 (the default) until the first trial says
    for (const StageDecl& d : decls_) {
      start_.stages.push_back(
          {d.options.concurrency, d.options.queue_capacity, d.threads_per_invocation});
      const auto declared = std::find_if(config_decls.begin(), config_decls.end(),
                                         [&](const StageDecl& c) { return c.name == d.name; });
      const Kind kind = d.shape.kind;
      Tunable t;
      t.stage = declared != config_decls.end() && d.name.find('/') == std::string::npos &&
                kind != Kind::kSource && kind != Kind::kMix && kind != Kind::kSink &&
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

  RunReport run() {
    const Clock::time_point begin = Clock::now();
    AutotuneReport tuning;
    Layout best = start_;
    double best_rate = 0;
    std::vector<double> busy(decls_.size(), 0.0);  // each stage's busy seconds so far
    double wall = 0;
    std::vector<double> load;  // best layout's busy share per worker
    std::vector<Layout> tried;
    std::vector<std::pair<Layout, std::string>> round = {{start_, "start"}};
    RunReport report;
    while (!round.empty()) {
      std::optional<std::size_t> winner;  // in `round`
      std::size_t winner_trial = 0;       // in tuning.trials
      double winner_rate = 0;
      std::vector<double> winner_load;
      for (std::size_t c = 0; c < round.size(); ++c) {
        if (tuning.trials.size() >= options_.autotune.max_trials) break;
        Layout& layout = round[c].first;
        double rate = 0;
        report = trial(layout, rate);
        if (tuning.trials.empty()) {  // what the pipeline resolved `threads: 0` and `cores` to
          cores_ = report.cores;
          layout.threads = start_.threads = report.threads;
        }
        tried.push_back(layout);
        // Each stage's share of its workers' time in this trial alone.
        const double trial_wall = report.wall_s - wall;
        std::vector<double> share(decls_.size(), 0.0);
        for (std::size_t i = 0; i < report.stages.size(); ++i) {
          const StageReport& s = report.stages[i];
          if (trial_wall > 0 && s.workers > 0) {
            share[i] = (s.busy_s - busy[i]) / (trial_wall * static_cast<double>(s.workers));
          }
          busy[i] = s.busy_s;
        }
        wall = report.wall_s;
        tuning.trials.push_back({round[c].second, describe(layout), rate, false});
        if (!report.paused) break;  // the run ended (its data, or a signal): nothing to tune
        const double bar = (winner ? winner_rate : best_rate) * (1 + options_.autotune.min_gain);
        if (tuning.trials.size() == 1 || rate > bar) {
          winner = c;
          winner_trial = tuning.trials.size() - 1;
          winner_rate = rate;
          winner_load = share;
        }
      }
      if (!report.paused || !winner) break;
      best = round[*winner].first;
      best_rate = winner_rate;
      load = winner_load;
      tuning.trials[winner_trial].kept = true;
      if (tuning.trials.size() >= options_.autotune.max_trials) break;
      round = candidates(best, load, tried);
    }
    tuning.tuning_s = std::chrono::duration<double>(Clock::now() - begin).count();
    tuning.tuning_items = pipeline_.produced();
    tuning.overrides = overrides(best);
    if (report.paused) {
      apply(best);
      RunOptions rest = options_;
      rest.threads = best.threads;
      report = pipeline_.run(rest);
    }
    report.autotune = std::move(tuning);
    return report;
  }

 private:
  // Runs `layout` for the warm-up and the measured window, then pauses; `rate` is the last
  // stage's items per second in the window (0 if the run ended first).
  RunReport trial(const Layout& layout, double& rate) {
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
    // The rate is the last stage's, between its first and its last completion in the window:
    // queues filling after the pause do not count, and a slow stage (a training step) is not
    // rounded to whole items per window.
    std::thread timer([&] {
      std::unique_lock lock(mutex);
      if (wake.wait_for(lock, seconds(options_.autotune.warmup_s), [&] { return done; })) return;
      const Clock::time_point end = Clock::now() + seconds(options_.autotune.trial_s);
      std::uint64_t seen = pipeline_.completed(), first = 0, last = 0;
      Clock::time_point first_at, last_at;
      while (!wake.wait_for(lock, std::chrono::milliseconds(2), [&] { return done; })) {
        const Clock::time_point now = Clock::now();
        if (const std::uint64_t n = pipeline_.completed(); n != seen) {
          if (first_at == Clock::time_point()) std::tie(first, first_at) = std::pair(n, now);
          std::tie(last, last_at) = std::pair(n, now);
          seen = n;
        }
        if (now >= end && last > first) {
          rate = static_cast<double>(last - first) /
                 std::chrono::duration<double>(last_at - first_at).count();
          pipeline_.request_pause();
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
                                                         const std::vector<double>& load,
                                                         const std::vector<Layout>& tried) const {
    std::vector<std::size_t> order;
    for (std::size_t i = 0; i < decls_.size(); ++i) {
      if (tunable_[i].stage && load[i] > 0.05) order.push_back(i);
    }
    std::sort(order.begin(), order.end(),
              [&](std::size_t a, std::size_t b) { return load[a] > load[b]; });
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
};

}  // namespace

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
                       const std::vector<StageDecl>& decls) {
  if (!options.autotune.enabled) return pipeline.run(options);
  return Tuner(pipeline, options, decls).run();
}

}  // namespace flowtrain
