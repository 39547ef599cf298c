#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "stages/train/step/step_record.hpp"
#include "stages/train/step/trainer.hpp"

namespace flowtrain::train {

/// What the nodes of one training step share: the Trainer and what the run measured. Made by
/// `train_step`, carried to `grad_sync` and `optimizer_step` in every GradBucket, so a node
/// written out by hand in a config finds the model it works on in its input.
struct TrainingSession {
  using Clock = std::chrono::steady_clock;

  std::unique_ptr<Trainer> trainer;
  int intraop_threads = 1;  // the step's: optimizer_step clips with as many (same sums)
  // Resumed from a step checkpoint of the run's last step (the job ended after writing it,
  // before final.pt): no step is left to take, and optimizer_step writes the final checkpoint.
  bool resumed_at_the_end = false;

  // Written by optimizer_step (serial) after each step, read by train_step's results() after
  // the run. Per-step time split, summed over this run; data_wait is from the end of one step
  // to the start of the next (the input was not ready).
  std::uint64_t steps_this_run = 0;
  double forward_s = 0, backward_s = 0, sync_s = 0, optimizer_s = 0, checkpoint_s = 0;
  double data_wait_s = 0;
  double bubble_sum = 0;   // with a pipeline: each step's idle share of partition-time, summed
  int peak_in_flight = 0;  // with a pipeline: most micro-batches a partition kept at once
  // With a pipeline: the most memory a partition held in a step, over the steps after this
  // run's first (whose backward also makes the gradients, kept from then on), and in the first.
  std::int64_t peak_bytes = 0, first_peak_bytes = 0;
  // With a pipeline: the actions of the last steps (at most kTimelineSpans), for the trace
  // and the report's chart.
  static constexpr std::size_t kTimelineSpans = 20000;
  std::deque<TimelineSpan> timeline;
  Clock::time_point last_step_end, run_begin;
  std::vector<StepRecord> history;  // without file bytes
  // What live_results() shows: read by the progress sampler's thread while the run lasts.
  std::atomic<std::uint64_t> live_step{0}, live_epoch{0}, live_images{0};
  std::atomic<double> live_loss{0};
};

/// One bucket of one step's gradients, on its way from `train_step` through `grad_sync` (which
/// averages it over the ranks) to `optimizer_step` (which steps once it has all `count`).
struct GradBucket {
  std::shared_ptr<TrainingSession> session;
  std::size_t index = 0;  // which bucket, in the order they fill during backward
  std::size_t count = 0;  // buckets of this step; 0: a batch passed over (Trainer::stopping)
};

}  // namespace flowtrain::train
