#pragma once

#include <cstdint>
#include <fstream>
#include <string>

#include "graph/registry.hpp"
#include "graph/tensorboard.hpp"
#include "stages/train/step/step_record.hpp"

namespace flowtrain::train {

/// The nodes that write a training run's files from the StepRecords of `train_step`, off the
/// step's critical path (a `train_step` entry brings them; see TrainStepStage::expand).

struct StepLogOptions {
  std::string dir;
  template <class Declare>
  void declare(Declare& d) {
    d(dir, "dir", "folder of steps.csv (empty: none written)", {.type = ParamType::kOutputPath});
  }
};

/// Appends one row per step to `dir`/steps.csv (rank 0): step, epoch, loss, correct, seen, lr,
/// time_s, the curves of a run's report; and, where the run writes TensorBoard events (an
/// EventWriter in its BuildContext), each step's train/loss, train/lr, train/top1 (of the
/// batch) and train/images_per_s. A run that resumed continues the file (rows of steps
/// redone after the checkpoint repeat: the last row of a step counts); a new run starts it
/// afresh. Without a dir the records end here.
class StepLogStage final : public SerialSink<StepRecord> {
 public:
  using Options = StepLogOptions;
  /// Built for a rehearsal (BuildContext::rehearsal) it writes nothing.
  explicit StepLogStage(const Options& options, const BuildContext& context = {});
  static StageDoc describe();

 protected:
  void consume(StepRecord&& record, ItemContext& ctx) override;

 private:
  std::string dir_;
  std::ofstream file_;
  EventWriter* events_;
};

struct CheckpointOptions {
  std::string dir;
  std::uint64_t keep = 2;
  template <class Declare>
  void declare(Declare& d) {
    d(dir, "dir", "folder of the checkpoint files (required)", {.type = ParamType::kOutputPath});
    d(keep, "keep", "step checkpoints kept (older ones are deleted; final.pt never)", {.min = 1});
  }
};

/// Writes each checkpoint a record carries to `dir` atomically (rank r > 0 adds ".rank<r>"),
/// then deletes this rank's step files beyond the newest `keep` (final.pt is never deleted).
class CheckpointStage final : public SerialSink<StepRecord> {
 public:
  using Options = CheckpointOptions;
  /// Built for a rehearsal (BuildContext::rehearsal) it writes nothing.
  explicit CheckpointStage(const Options& options, const BuildContext& context = {});
  static StageDoc describe();
  std::vector<StageResult> results() const override;

 protected:
  void consume(StepRecord&& record, ItemContext& ctx) override;

 private:
  std::string dir_;
  std::uint64_t keep_;
  bool rehearsal_;
  std::uint64_t written_ = 0;
};

struct SnapshotOptions {
  std::string dir;
  template <class Declare>
  void declare(Declare& d) {
    d(dir, "dir", "folder holding snapshots/ (required)", {.type = ParamType::kOutputPath});
  }
};

/// Writes each snapshot (the model alone) a record carries to `dir`/snapshots/, to validate
/// the model along the training.
class SnapshotStage final : public SerialSink<StepRecord> {
 public:
  using Options = SnapshotOptions;
  /// Built for a rehearsal (BuildContext::rehearsal) it writes nothing.
  explicit SnapshotStage(const Options& options, const BuildContext& context = {});
  static StageDoc describe();
  std::vector<StageResult> results() const override;

 protected:
  void consume(StepRecord&& record, ItemContext& ctx) override;

 private:
  std::string dir_;
  bool rehearsal_;
  std::uint64_t written_ = 0;
};

}  // namespace flowtrain::train
