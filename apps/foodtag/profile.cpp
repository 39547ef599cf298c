#include "apps/foodtag/profile.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>

#include "stages/train/step/step_times.hpp"

namespace foodtag {

namespace {

std::optional<double> result(const flowtrain::StageReport& stage, const std::string& name) {
  for (const flowtrain::StageResult& r : stage.results) {
    if (r.name == name) return r.value;
  }
  return std::nullopt;
}

std::optional<double> live(const flowtrain::StageProgress& stage, const std::string& name) {
  for (const flowtrain::StageResult& r : stage.live) {
    if (r.name == name) return r.value;
  }
  return std::nullopt;
}

std::string format(const char* pattern, double a, double b = 0) {
  char buf[96];
  std::snprintf(buf, sizeof buf, pattern, a, b);
  return buf;
}

}  // namespace

std::string duration_text(double seconds) {
  const auto s = static_cast<long long>(std::llround(std::max(0.0, seconds)));
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", s / 3600, s % 3600 / 60);
  } else if (s >= 60) {
    std::snprintf(buf, sizeof buf, "%lldm%02llds", s / 60, s % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%llds", s);
  }
  return buf;
}

std::string ProgressLine::next(const flowtrain::Progress& p) {
  std::string line = phase_;
  // The training stage (the one reporting steps) says where the run is.
  const flowtrain::StageProgress* trainer = nullptr;
  const flowtrain::StageProgress* busiest = nullptr;
  for (const flowtrain::StageProgress& s : p.stages) {
    if (live(s, "step")) trainer = &s;
    if (!busiest || s.busy_fraction > busiest->busy_fraction) busiest = &s;
  }
  double done = static_cast<double>(p.completed);
  double total = static_cast<double>(p.expected);
  if (trainer) {
    const double epoch = live(*trainer, "epoch").value_or(0);
    if (epoch > 0) {
      line += format("  epoch %.0f", epoch);
      if (epochs_ > 0) {
        line += '/';  // not "/" + std::to_string(...): GCC 12 warns of a false -Wrestrict there
        line += std::to_string(epochs_);
      }
    }
    done = live(*trainer, "step").value_or(0);
    total = live(*trainer, "total_steps").value_or(total);
    line += format("  step %.0f", done);
    if (total > 0) line += format("/%.0f", total);
    const double images = live(*trainer, "images").value_or(0);
    const double interval = p.elapsed_s - last_time_s_;
    if (interval > 0 && images > last_images_) {
      line += format("  %.1f img/s", (images - last_images_) / interval);
    }
    last_images_ = images;
  } else {
    line += format("  batch %.0f", done);
    if (total > 0) line += format("/%.0f", total);
  }
  last_time_s_ = p.elapsed_s;
  if (total > 0 && done > 0 && done < total) {
    line += "  ETA " + duration_text(p.elapsed_s / done * (total - done));
  }
  if (trainer) {
    if (const std::optional<double> loss = live(*trainer, "loss"); loss && done > 0) {
      line += format("  loss %.3f", *loss);
    }
  }
  for (const flowtrain::StageProgress& s : p.stages) {  // a teacher_cache's hits so far
    const std::optional<double> hits = live(s, "hits"), misses = live(s, "misses");
    if (hits && misses && *hits + *misses > 0) {
      line += format("  cache %.0f%% hits", 100 * *hits / (*hits + *misses));
    }
  }
  if (busiest && busiest->busy_fraction > 0) {
    line += "  " + busiest->name + format(" busy %.0f%%", busiest->busy_fraction * 100);
  }
  return line;
}

std::string step_split(const flowtrain::RunReport& report) {
  const std::optional<flowtrain::StepTimes> step = flowtrain::step_times(report);
  if (!step || step->stage->items_in == 0) return {};
  const flowtrain::StageReport* teacher = nullptr;
  const flowtrain::StageReport* cache = nullptr;
  for (const flowtrain::StageReport& s : report.stages) {
    if (s.name == "teacher_infer") teacher = &s;
    if (s.name == "teacher_cache") cache = &s;
  }
  std::string line =
      "per step: data wait" + format(" %.0f ms", step->data_wait_ms) +
      format(", forward %.0f ms, backward %.0f ms", step->forward_ms, step->backward_ms) +
      format(", sync %.0f ms, optimizer %.0f ms", step->sync_wait_ms, step->optimizer_ms) +
      format(" (%.0f ms", step->step_ms());
  if (step->images > 0 && report.wall_s > 0) {
    line += format(", %.1f images/s", step->images / report.wall_s);
  }
  line += ")";
  if (step->gflops) line += "; " + step->stage->name + format(" %.0f GFLOP/s", *step->gflops);
  if (teacher && teacher->items_in > 0) {
    line += format("; teacher %.0f ms per batch",
                   teacher->busy_s * 1e3 / static_cast<double>(teacher->items_in));
    line += teacher->workers == 1
                ? " on 1 worker"
                : format(" on each of %.0f workers", static_cast<double>(teacher->workers));
    line += ", ahead of the student";
    if (const std::optional<double> gflops = result(*teacher, "gflops")) {
      line += format(", %.0f GFLOP/s", *gflops);
    }
  }
  if (cache) {
    if (const std::optional<double> hit_rate = result(*cache, "hit_rate")) {
      line += format("; teacher cache %.0f%% hits", *hit_rate);
    }
  }
  return line;
}

std::string cache_summary(const flowtrain::RunReport& report) {
  for (const flowtrain::StageReport& s : report.stages) {
    if (s.name != "teacher_cache") continue;
    const double hits = result(s, "hits").value_or(0);
    const double misses = result(s, "misses").value_or(0);
    std::string line = format("teacher cache: %.0f hits, %.0f misses", hits, misses);
    if (hits + misses > 0) line += format(" (%.0f%% hits)", 100 * hits / (hits + misses));
    if (const std::optional<double> entries = result(s, "entries")) {
      line += format("; %.0f views stored, %.2f MB", *entries, result(s, "disk_mb").value_or(0));
    }
    if (const std::optional<double> bytes = result(s, "bytes_per_view")) {
      line += format(" (%.1f bytes a view)", *bytes);
    }
    if (const std::optional<double> saved = result(s, "saved_s"); saved && *saved > 0) {
      line += "; teacher time saved " + duration_text(*saved);
    }
    return line;
  }
  return {};
}

}  // namespace foodtag
