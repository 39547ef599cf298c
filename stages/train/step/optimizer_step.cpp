#include "stages/train/step/optimizer_step.hpp"

#include <algorithm>
#include <string>

#include "graph/error.hpp"
#include "stages/train/files/checkpoint.hpp"
#include "stages/train/models/compute.hpp"

namespace flowtrain::train {

namespace {

using Clock = TrainingSession::Clock;

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

OptimizerStepStage::OptimizerStepStage(const Options& options)
    : intraop_threads_(options.intraop_threads),
      checkpoint_every_(options.checkpoint_every),
      snapshot_every_(options.snapshot_every),
      final_checkpoint_(options.final_checkpoint) {}

StageDoc OptimizerStepStage::describe() {
  return {
      "Ends a training step once all its gradient buckets came: clips, steps AdamW (or its "
      "ZeRO shard), takes checkpoint and snapshot bytes when due, emits the step's record "
      "and sends `train_step` the token its next forward waits for. Brought by a "
      "`train_step` entry as `<name>/optimizer_step`, its params set from the entry's.",
      option_specs<Options>(), "intraop_threads"};
}

void OptimizerStepStage::process(GradBucket&& bucket, Emitter<StepRecord>& out) {
  if (!session_) session_ = bucket.session;
  if (bucket.count == 0) {  // a batch passed over once the ranks agreed to stop
    out.send_token();
    return;
  }
  if (bucket.session != session_ || bucket.index != next_bucket_) {
    throw Error("got bucket " + std::to_string(bucket.index) + " of " +
                std::to_string(bucket.count) + " where bucket " + std::to_string(next_bucket_) +
                " of its step was due: one train_step feeds it, through order-keeping stages");
  }
  if (++next_bucket_ < bucket.count) return;
  next_bucket_ = 0;
  apply(*session_, out);
  out.send_token();
}

void OptimizerStepStage::apply(TrainingSession& s, Emitter<StepRecord>& out) {
  Trainer& trainer = *s.trainer;
  IntraOpThreads threads(intraop_threads_);
  StepOutcome step = trainer.apply();  // its timeline moves into the session
  if (s.steps_this_run == 0) {
    s.run_begin = step.begin;
  } else {
    s.data_wait_s += seconds(s.last_step_end, step.begin);
  }
  s.last_step_end = step.end;
  if (!step.applied) return;
  ++s.steps_this_run;
  s.forward_s += seconds(step.begin, step.forward_end);
  s.backward_s += seconds(step.forward_end, step.backward_end);
  s.sync_s += seconds(step.backward_end, step.sync_end);
  s.optimizer_s += seconds(step.sync_end, step.end);
  s.bubble_sum += step.bubble;
  s.peak_in_flight = std::max(s.peak_in_flight, step.peak_in_flight);
  std::int64_t& peak_bytes = s.steps_this_run == 1 ? s.first_peak_bytes : s.peak_bytes;
  peak_bytes = std::max(peak_bytes, step.peak_bytes);
  for (TimelineSpan& span : step.timeline) {
    span.item = trainer.state().step;
    s.timeline.push_back(std::move(span));
  }
  while (s.timeline.size() > TrainingSession::kTimelineSpans) s.timeline.pop_front();

  const TrainState& state = trainer.state();
  StepRecord record{.step = state.step,
                    .batch_number = step.batch_number,
                    .epoch = state.epoch,
                    .loss = step.loss,
                    .lr = step.lr,
                    .correct = step.correct,
                    .seen = step.seen,
                    .begin_s = seconds(s.run_begin, step.begin),
                    .time_s = seconds(s.run_begin, step.end),
                    .rank = trainer.rank(),
                    .world_size = trainer.world_size()};
  s.history.push_back(record);
  const double smoothed =
      s.steps_this_run == 1 ? step.loss : 0.9 * s.live_loss.load() + 0.1 * step.loss;
  s.live_loss.store(smoothed, std::memory_order_relaxed);
  s.live_images.fetch_add(step.seen, std::memory_order_relaxed);
  s.live_epoch.store(state.epoch + 1, std::memory_order_relaxed);
  s.live_step.store(state.step, std::memory_order_relaxed);

  // The files' contents are this step's: taken now (before the next forward may draw from
  // the RNG), written by the nodes downstream.
  const auto files_begin = Clock::now();
  if (checkpoint_every_ > 0 && state.step % checkpoint_every_ == 0) {
    record.checkpoint_name = step_checkpoint_name(state.step);
    record.checkpoint = std::make_shared<const std::string>(trainer.checkpoint(true));
  }
  if (snapshot_every_ > 0 && state.step % snapshot_every_ == 0 && trainer.rank() == 0) {
    record.snapshot = std::make_shared<const std::string>(trainer.checkpoint(false));
  }
  s.checkpoint_s += seconds(files_begin, Clock::now());
  out.emit(std::move(record));
  s.last_step_end = Clock::now();
}

void OptimizerStepStage::finish(Emitter<StepRecord>& out) {
  if (!final_checkpoint_ || !session_) return;
  if (session_->steps_this_run == 0 && !session_->resumed_at_the_end) return;
  const Trainer& trainer = *session_->trainer;
  const TrainState& state = trainer.state();
  // A run that reached the end of its data is final; one stopped early is a resumable step.
  StepRecord record{
      .epoch = state.epoch, .rank = trainer.rank(), .world_size = trainer.world_size()};
  record.checkpoint_name =
      state.step >= state.total_steps ? "final.pt" : step_checkpoint_name(state.step);
  const auto begin = Clock::now();
  record.checkpoint = std::make_shared<const std::string>(trainer.checkpoint(true));
  session_->checkpoint_s += seconds(begin, Clock::now());
  out.emit(std::move(record));
}

FLOWTRAIN_REGISTER_STAGE("optimizer_step", OptimizerStepStage);

}  // namespace flowtrain::train
