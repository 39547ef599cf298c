#include "graph/metrics.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "graph/cpu_usage.hpp"
#include "graph/csv.hpp"
#include "graph/error.hpp"

namespace flowtrain::detail {

DropLog::DropLog(std::string path) : path_(std::move(path)) {
  file_ = std::fopen(path_.c_str(), "w");
  if (file_ == nullptr) {
    throw Error("cannot write the list of dropped items " + path_ + ": " + std::strerror(errno));
  }
  failed_ = std::fputs("stage,item,reason\n", file_) < 0;
}

DropLog::~DropLog() {
  if (file_ != nullptr) std::fclose(file_);
}

void DropLog::write(const std::string& stage, std::uint64_t seq, const std::string& reason) {
  const std::string line = csv_line({stage, std::to_string(seq), reason});
  std::lock_guard lock(mutex_);
  ++lines_;
  failed_ = failed_ || std::fputs(line.c_str(), file_) < 0;
}

std::string DropLog::close() {
  std::lock_guard lock(mutex_);
  if (file_ == nullptr) return lines_ > 0 ? path_ : "";
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  if (failed_ || !closed) {
    throw Error("cannot write the list of dropped items " + path_ + ": " + std::strerror(errno));
  }
  if (lines_ == 0) {
    std::remove(path_.c_str());
    return "";
  }
  return path_;
}

void StageCounters::record_drop(std::uint64_t seq, std::string reason) {
  if (drop_log != nullptr) drop_log->write(name, seq, reason);
  std::lock_guard lock(drops_mutex);
  ++dropped;
  if (drops.size() < StageReport::kMaxDropRecords) drops.push_back({seq, std::move(reason)});
}

void SeriesBuilder::add(double time_s, double value) {
  pending_.time_s += time_s;
  pending_.occupancy += value;
  if (++pending_count_ < stride_) return;
  points_.push_back({pending_.time_s / pending_count_, pending_.occupancy / pending_count_});
  pending_ = {};
  pending_count_ = 0;
  if (points_.size() < 2 * kMaxPoints) return;
  for (std::size_t i = 0; i < kMaxPoints; ++i) {
    const QueueSample& a = points_[2 * i];
    const QueueSample& b = points_[2 * i + 1];
    points_[i] = {(a.time_s + b.time_s) / 2, (a.occupancy + b.occupancy) / 2};
  }
  points_.resize(kMaxPoints);
  stride_ *= 2;
}

std::vector<QueueSample> SeriesBuilder::take() { return std::move(points_); }

Sampler::Sampler(const std::vector<std::unique_ptr<StageCounters>>& counters,
                 std::vector<StageGeometry> geometry,
                 double interval_ms,
                 Clock::time_point start,
                 ProgressFn on_progress,
                 double progress_interval_s,
                 std::uint64_t expected)
    : counters_(counters),
      geometry_(std::move(geometry)),
      interval_(std::max<std::int64_t>(100, static_cast<std::int64_t>(interval_ms * 1000))),
      start_(start),
      on_progress_(std::move(on_progress)),
      progress_interval_(std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(progress_interval_s))),
      next_progress_(start + progress_interval_),
      expected_(expected),
      cpu_(std::make_unique<CpuRecorder>(start)),
      acc_(geometry_.size()),
      thread_([this] { loop(); }) {}

Sampler::~Sampler() { stop(); }

void Sampler::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Sampler::loop() {
  std::unique_lock lock(mutex_);
  while (!wake_.wait_for(lock, interval_, [this] { return stopping_; })) {
    sample_once();
    const Clock::time_point now = Clock::now();
    cpu_->poll(now);
    if (on_progress_ && now >= next_progress_) report_progress();
  }
}

void Sampler::report_progress() {
  next_progress_ += progress_interval_;
  Progress p;
  p.elapsed_s = std::chrono::duration<double>(Clock::now() - start_).count();
  p.produced = counters_.front()->items_out.load(std::memory_order_relaxed);
  p.completed = counters_.back()->items_in.load(std::memory_order_relaxed);
  p.expected = expected_;
  p.stages.reserve(geometry_.size());
  for (std::size_t i = 0; i < geometry_.size(); ++i) {
    const StageGeometry& geo = geometry_[i];
    StageProgress stage;
    stage.name = geo.name;
    const double busy_s =
        static_cast<double>(counters_[i]->busy_ns.load(std::memory_order_relaxed)) / 1e9;
    if (p.elapsed_s > 0) {
      // An invocation's time is counted when it ends, so a slow one can end past the moment
      // the elapsed time was read.
      stage.busy_fraction =
          std::min(1.0, busy_s / (p.elapsed_s * static_cast<double>(geo.workers)));
    }
    if (geo.stage) stage.live = geo.stage->live_results();
    p.stages.push_back(std::move(stage));
  }
  on_progress_(p);
}

void Sampler::sample_once() {
  const double t = std::chrono::duration<double>(Clock::now() - start_).count();
  const std::size_t n = geometry_.size();
  for (std::size_t i = 0; i < n; ++i) {
    const StageGeometry& geo = geometry_[i];
    const StageCounters& c = *counters_[i];
    const auto active = static_cast<std::size_t>(c.active.load(std::memory_order_relaxed));
    const std::size_t free_slots = geo.workers > active ? geo.workers - active : 0;

    const double waiting = geo.inputs.empty() ? 1.0 : waiting_for(i);  // a source always has input
    if (!geo.inputs.empty()) {
      acc_[i].queue_sum += waiting;
      acc_[i].queue_max = std::max(acc_[i].queue_max, waiting);
      acc_[i].series.add(t, waiting);
    }
    if (free_slots == 0) continue;
    if (waiting == 0) {
      acc_[i].starved_slots += static_cast<double>(free_slots);
    } else if (geo.out_capacity > 0) {
      double queued = 0;  // the fullest of its output edges
      for (const std::size_t to : geo.consumers) queued = std::max(queued, queued_between(i, to));
      if (queued + static_cast<double>(active) >= geo.out_capacity) {
        acc_[i].blocked_slots += static_cast<double>(free_slots);
      }
    }
  }
  ++samples_;
}

double Sampler::queued_between(std::size_t producer, std::size_t consumer) const {
  const auto emitted = counters_[producer]->emitted.load(std::memory_order_relaxed);
  const auto started = counters_[consumer]->started.load(std::memory_order_relaxed);
  const double queued = emitted > started ? static_cast<double>(emitted - started) : 0.0;
  // A source whose output is full holds one produced item outside the queue; it counts in
  // `emitted` but is not in the queue.
  return geometry_[producer].inputs.empty()
             ? std::min(queued, static_cast<double>(geometry_[producer].out_capacity))
             : queued;
}

double Sampler::waiting_for(std::size_t stage) const {
  // A join can start only the items every input has brought: the least of its queues.
  double waiting = -1;
  for (const std::size_t p : geometry_[stage].inputs) {
    const double q = queued_between(p, stage);
    waiting = waiting < 0 ? q : std::min(waiting, q);
  }
  return std::max(waiting, 0.0);
}

void Sampler::fill(RunReport& report) {
  report.cpu = cpu_->finish();
  std::vector<StageReport>& stages = report.stages;
  for (std::size_t i = 0; i < stages.size() && i < acc_.size(); ++i) {
    StageReport& s = stages[i];
    const Accumulated& a = acc_[i];
    if (samples_ > 0) {
      const double slot_samples = static_cast<double>(samples_ * geometry_[i].workers);
      s.starved_fraction = a.starved_slots / slot_samples;
      s.blocked_fraction = a.blocked_slots / slot_samples;
      s.queue_mean = a.queue_sum / static_cast<double>(samples_);
    }
    s.queue_max = a.queue_max;
    s.queue_series = acc_[i].series.take();
  }
}

}  // namespace flowtrain::detail
