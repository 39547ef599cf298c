#pragma once

// What foodtag prints while and after a phase runs: the live progress line and the per-step
// time split. Pure functions of the graph's Progress and RunReport (no LibTorch), so tests can
// check them on hand-made values.

#include <cstdint>
#include <string>

#include "graph/report.hpp"

namespace foodtag {

/// Turns progress snapshots into lines such as
///   distill  epoch 3/40  step 120/280  63.1 img/s  ETA 3m12s  loss 0.842  teacher_infer busy 97%
/// Images/s is measured since the previous line; the ETA from the rate since the start. With a
/// teacher_cache, "cache 75% hits" (its views found so far) comes before the busiest stage.
class ProgressLine {
 public:
  /// `epochs`: passes the phase's source makes (0: unknown, then no "/N").
  ProgressLine(std::string phase, std::uint64_t epochs) : phase_(std::move(phase)), epochs_(epochs) {}
  std::string next(const flowtrain::Progress& p);

 private:
  std::string phase_;
  std::uint64_t epochs_;
  double last_time_s_ = 0;
  double last_images_ = 0;
};

/// "1h02m", "3m12s", "45s".
std::string duration_text(double seconds);

/// The per-step split of a training phase, from its report (empty if it has no training stage):
///   per step: data wait 35 ms, forward 208 ms, backward 399 ms, sync 0 ms, optimizer 8 ms
///   (650 ms, 98.5 images/s); student 61 GFLOP/s; teacher 968 ms per batch on each of 2
///   workers, ahead of the student, 74 GFLOP/s
/// (the GFLOP/s of the training stage, named, and of teacher_infer: their products' rate).
std::string step_split(const flowtrain::RunReport& report);

/// What the phase's teacher_cache did, from its results (empty without one):
///   teacher cache: 43000 hits, 0 misses (100% hits); 43000 views stored, 2.51 MB (58.4 bytes a
///   view); teacher time saved 3m02s
std::string cache_summary(const flowtrain::RunReport& report);

}  // namespace foodtag
