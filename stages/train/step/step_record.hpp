#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace flowtrain::train {

/// What `train_step` sends downstream after each optimizer step (and once more at the end),
/// for the nodes that write the run's files off the training's critical path: `step_log`,
/// `checkpoint` and `snapshot`. File contents are taken between steps (they must be the weights
/// of this step); writing them is the receivers' work.
struct StepRecord {
  std::uint64_t step = 0;          // 1-based count after this step; 0 for the record at the end
  std::uint64_t batch_number = 0;  // Batch::number of its batch
  std::uint32_t epoch = 0;         // 0-based epoch of its last sample
  double loss = 0;
  double lr = 0;
  std::uint64_t correct = 0;  // training predictions that matched the label
  std::uint64_t seen = 0;     // samples in the batch
  double begin_s = 0;         // from the start of the run's first step to the start of this one
  double time_s = 0;          // ... to the end of this one
  int rank = 0;               // data-parallel rank that trained it
  int world_size = 1;         // ranks that each write their file of a checkpoint

  /// A checkpoint due now ("step-00000042.pt", or "final.pt" at the end): its file name (rank
  /// 0's; other ranks add ".rankN") and bytes (weights, optimizer state, RNG, state).
  std::string checkpoint_name;
  std::shared_ptr<const std::string> checkpoint;
  /// A snapshot due now (rank 0, every snapshot_every steps): the model alone, for validation
  /// along the training; file name as checkpoint_name.
  std::shared_ptr<const std::string> snapshot;
};

}  // namespace flowtrain::train
