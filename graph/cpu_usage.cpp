#include "graph/cpu_usage.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <fstream>
#include <sstream>

namespace flowtrain::detail {

std::optional<std::vector<CoreTicks>> read_core_ticks(const std::string& stat_path) {
  std::ifstream in(stat_path);
  if (!in) return std::nullopt;
  std::vector<CoreTicks> cores;
  for (std::string line; std::getline(in, line);) {
    // "cpu0 user nice system idle iowait irq softirq steal guest guest_nice"; the summary line
    // "cpu ..." has no number. Guest time is already counted in user and nice.
    if (line.size() < 4 || line.compare(0, 3, "cpu") != 0 || line[3] < '0' || line[3] > '9') {
      continue;
    }
    std::istringstream fields(line);
    std::string name;
    fields >> name;
    std::uint64_t v[8] = {};
    for (std::uint64_t& x : v) fields >> x;
    if (!fields) return std::nullopt;
    CoreTicks ticks;
    for (const std::uint64_t x : v) ticks.total += x;
    const std::uint64_t idle = v[3] + v[4];
    ticks.busy = ticks.total > idle ? ticks.total - idle : 0;
    cores.push_back(ticks);
  }
  if (cores.empty()) return std::nullopt;
  return cores;
}

double process_cpu_seconds() {
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  auto seconds = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6;
  };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

std::uint64_t process_page_faults() {
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<std::uint64_t>(usage.ru_minflt);
}

namespace {
// Busy share of the ticks between two readings of one core; 0 if no tick passed.
double busy_between(const CoreTicks& a, const CoreTicks& b) {
  if (b.total <= a.total) return 0;
  const double busy = b.busy > a.busy ? static_cast<double>(b.busy - a.busy) : 0.0;
  return std::min(1.0, busy / static_cast<double>(b.total - a.total));
}
}  // namespace

CpuRecorder::CpuRecorder(Clock::time_point start, Clock::duration interval, std::string stat_path)
    : stat_path_(std::move(stat_path)),
      start_(start),
      interval_(interval),
      next_(start + interval),
      process_start_s_(process_cpu_seconds()),
      faults_start_(process_page_faults()) {
  if (std::optional<std::vector<CoreTicks>> ticks = read_core_ticks(stat_path_)) {
    enabled_ = true;
    first_ = *ticks;
    last_ = std::move(*ticks);
    series_.resize(first_.size());
  }
}

void CpuRecorder::poll(Clock::time_point now) {
  if (!enabled_ || now < next_) return;
  // Skip intervals missed (a stalled machine) rather than sampling several times at once.
  while (next_ <= now) next_ += interval_;
  sample(now);
}

void CpuRecorder::sample(Clock::time_point now) {
  std::optional<std::vector<CoreTicks>> ticks = read_core_ticks(stat_path_);
  if (!ticks || ticks->size() != last_.size()) return;  // unreadable now, or cores went offline
  const double t = std::chrono::duration<double>(now - start_).count();
  for (std::size_t c = 0; c < last_.size(); ++c) {
    series_[c].add(t, busy_between(last_[c], (*ticks)[c]));
  }
  last_ = std::move(*ticks);
}

CpuReport CpuRecorder::finish() {
  CpuReport report;
  if (!enabled_) return report;
  report.interval_s = std::chrono::duration<double>(interval_).count();
  report.process_cpu_s = process_cpu_seconds() - process_start_s_;
  report.page_faults = process_page_faults() - faults_start_;
  std::vector<CoreTicks> end = last_;
  if (std::optional<std::vector<CoreTicks>> ticks = read_core_ticks(stat_path_);
      ticks && ticks->size() == first_.size()) {
    end = std::move(*ticks);
  }
  for (std::size_t c = 0; c < first_.size(); ++c) {
    report.core_mean.push_back(busy_between(first_[c], end[c]));
    std::vector<QueueSample> points = series_[c].take();
    if (c == 0) {
      for (const QueueSample& p : points) report.times_s.push_back(p.time_s);
    }
    std::vector<double> values;
    values.reserve(points.size());
    for (const QueueSample& p : points) values.push_back(p.occupancy);
    report.cores.push_back(std::move(values));
  }
  enabled_ = false;
  return report;
}

void append_cpu(CpuReport& whole, double whole_wall_s, CpuReport segment, double segment_wall_s) {
  if (whole.core_mean.empty()) {  // the first run, or one without /proc/stat
    const double process_cpu_s = whole.process_cpu_s + segment.process_cpu_s;
    const std::uint64_t page_faults = whole.page_faults + segment.page_faults;
    for (double& t : segment.times_s) t += whole_wall_s;
    whole = std::move(segment);
    whole.process_cpu_s = process_cpu_s;
    whole.page_faults = page_faults;
    return;
  }
  whole.process_cpu_s += segment.process_cpu_s;
  whole.page_faults += segment.page_faults;
  if (segment.core_mean.size() != whole.core_mean.size()) return;  // cores went offline
  const double total = whole_wall_s + segment_wall_s;
  for (std::size_t c = 0; c < whole.core_mean.size(); ++c) {
    if (total > 0) {
      whole.core_mean[c] =
          (whole.core_mean[c] * whole_wall_s + segment.core_mean[c] * segment_wall_s) / total;
    }
    if (c < whole.cores.size() && c < segment.cores.size()) {
      whole.cores[c].insert(whole.cores[c].end(), segment.cores[c].begin(), segment.cores[c].end());
    }
  }
  for (const double t : segment.times_s) whole.times_s.push_back(t + whole_wall_s);
}

}  // namespace flowtrain::detail
