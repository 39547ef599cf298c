#include "stages/train/partitioned/partition_node.hpp"

#include "graph/error.hpp"

namespace flowtrain::train {

TrainPartitionStage::TrainPartitionStage(const Options& options)
    : options_(options) {
  if (options.partition >= options.partitions) {
    throw Error("param 'partition' (" + std::to_string(options.partition) +
                ") must be below partitions (" + std::to_string(options.partitions) + ")");
  }
}

StageDoc TrainPartitionStage::describe() {
  return {
      "A partition of a training step's model after the first, in one process, brought by a "
      "train_step entry with partitions as `<name>/partition<N>`: runs its forwards and "
      "backwards of each step's micro-batches in the schedule's order on its own "
      "intraop_threads, at the same time as the other partitions (waiting for their tensors "
      "frees its graph thread); the last one ends the step.",
      option_specs<Options>(), "intraop_threads", /*threads_change_results=*/true};
}

void TrainPartitionStage::process(GradBucket&& bucket, Emitter<GradBucket>& out) {
  if (!session_) {
    session_ = bucket.session;
    published_.store(session_.get(), std::memory_order_release);
  }
  Trainer& trainer = *session_->trainer;
  const bool last = options_.partition + 1 == options_.partitions;
  if (bucket.count == 0) {  // passed over (Trainer::stopping)
    out.emit(std::move(bucket));
    return;
  }
  if (!last) out.emit(std::move(bucket));  // the next partition starts its part now
  trainer.partitioned()->run_partition(options_.partition);
  if (!last) return;
  const std::size_t buckets = trainer.end_partitions();
  for (std::size_t b = 0; b < buckets; ++b) out.emit(GradBucket{session_, b, buckets});
}

std::vector<StageResult> TrainPartitionStage::results() const {
  const TrainingSession* s = published_.load(std::memory_order_acquire);
  if (!s || s->steps_this_run == 0) return {};
  return {{"waited_ms", s->trainer->partitioned()->wait_seconds(options_.partition) * 1e3 /
                            static_cast<double>(s->steps_this_run)}};
}

StageWait TrainPartitionStage::waiting() const {
  const TrainingSession* s = published_.load(std::memory_order_acquire);
  return s ? partition_wait(*s, options_.partition, options_.microbatches) : StageWait{};
}

void TrainPartitionStage::cancel() {
  if (TrainingSession* s = published_.load(std::memory_order_acquire)) {
    s->trainer->partitioned()->cancel("the run failed in another stage");
  }
}

StageWait partition_wait(const TrainingSession& session, int partition, int microbatches) {
  return {.seconds = session.trainer->partitioned()->wait_seconds(partition),
          .what = "the other partitions' activations and gradients (the pipeline's bubble)",
          .param = "microbatches",
          .value = static_cast<double>(microbatches),
          .held_after = false,
          .entry_param = partition > 0};
}

FLOWTRAIN_REGISTER_STAGE("train_partition", TrainPartitionStage);

}  // namespace flowtrain::train
