#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "graph/options.hpp"

namespace flowtrain::train {

/// How the micro-batches of one batch flow through a model split into pipeline stages, as
/// torch.distributed.pipelining names them:
/// - kGPipe: every forward, then every backward (ScheduleGPipe). Simple; all M micro-batches'
///   activations are alive at the turn.
/// - k1F1B: after a warm-up of forwards, each rank alternates one forward and one backward
///   (Schedule1F1B): the same bubble as GPipe, but at most P - rank micro-batches in flight.
/// - kInterleaved: each rank holds V stages (chunks of the model, stage v * P + rank), and
///   runs Megatron's interleaved 1F1B over them (ScheduleInterleaved1F1B): a bubble about V
///   times smaller, for more communication. M must be a multiple of P.
enum class PartitionScheduleKind { kGPipe, k1F1B, kInterleaved };

/// A config's names of them (param partition_schedule): gpipe, 1f1b, interleaved.
inline std::span<const EnumName<PartitionScheduleKind>> enum_names(PartitionScheduleKind) {
  static constexpr EnumName<PartitionScheduleKind> names[] = {
      {PartitionScheduleKind::kGPipe, "gpipe"},
      {PartitionScheduleKind::k1F1B, "1f1b"},
      {PartitionScheduleKind::kInterleaved, "interleaved"}};
  return names;
}
inline const char* to_string(PartitionScheduleKind kind) { return enum_name(kind); }

/// Where a partitioned model is split without partition_splits (param partition_balance).
enum class PartitionBalance { kBlocks, kMeasured };
inline std::span<const EnumName<PartitionBalance>> enum_names(PartitionBalance) {
  static constexpr EnumName<PartitionBalance> names[] = {{PartitionBalance::kBlocks, "blocks"},
                                                         {PartitionBalance::kMeasured, "measured"}};
  return names;
}

/// One action of a rank's schedule: the forward or the backward of one micro-batch through one
/// pipeline stage that rank holds.
struct PartitionAction {
  enum class Kind { kForward, kBackward };
  Kind kind = Kind::kForward;
  int stage = 0;       // 0 .. stages - 1, in model order
  int microbatch = 0;  // 0 .. M - 1
  bool operator==(const PartitionAction&) const = default;
};

/// A schedule: for each rank, the actions it runs, in order. Stage s lives on rank s % ranks.
/// A forward of stage s > 0 takes stage s - 1's output of the same micro-batch; a backward of
/// stage s < stages - 1 takes the gradient stage s + 1's backward sent back; the last stage's
/// forward ends in the loss.
struct PartitionSchedule {
  PartitionScheduleKind kind = PartitionScheduleKind::kGPipe;
  int ranks = 1;
  int stages = 1;  // ranks x chunks per partition (model chunks in all)
  int microbatches = 1;
  std::vector<std::vector<PartitionAction>> actions;  // [rank]

  int rank_of(int stage) const { return stage % ranks; }
};

/// The schedule of `kind` for `ranks` ranks holding `chunks_per_partition` stages each (1 but for
/// kInterleaved) and `microbatches` micro-batches. Throws Error on counts it cannot schedule
/// (below 1; kInterleaved with microbatches not a multiple of ranks).
///   const PartitionSchedule s = make_partition_schedule(PartitionScheduleKind::k1F1B, 2, 4);
///   // s.actions[0]: F0 F1 B0 F2 B1 F3 B2 B3   s.actions[1]: F0 B0 F1 B1 F2 B2 F3 B3
PartitionSchedule make_partition_schedule(PartitionScheduleKind kind,
                                          int ranks,
                                          int microbatches,
                                          int chunks_per_partition = 1);

/// What running a schedule with a given cost per action takes, every rank starting an action
/// as soon as its input has arrived (communication free): the makespan, the share of
/// rank-time idle (the bubble), and each stage's most micro-batches in flight (forward done,
/// backward not yet: activations it must keep).
struct PartitionTimeline {
  double makespan = 0;
  double bubble = 0;                // 1 - busy / (ranks x makespan)
  std::vector<int> peak_in_flight;  // [stage]
  /// When each action of each rank starts and ends, in schedule order ([rank][i]).
  std::vector<std::vector<std::pair<double, double>>> spans;
};

/// Simulates `schedule` with every forward costing `forward` and every backward `backward`
/// (per stage). Throws Error if the schedule cannot finish (an action waits for one that never
/// runs: a deadlock), naming the rank and the action.
PartitionTimeline simulate_pipeline(const PartitionSchedule& schedule,
                                    double forward = 1,
                                    double backward = 2);

/// The textbook bubble of GPipe and 1F1B with P stages and M micro-batches: (P - 1) / (M + P - 1).
double textbook_bubble(int stages, int microbatches);

/// "F3" for the forward of micro-batch 3, "B3.1" for the backward of stage 3's micro-batch 1
/// when ranks hold several stages: an action as charts and messages name it.
std::string describe_action(const PartitionSchedule& schedule, const PartitionAction& action);

/// "F0 F1 B0 ..." for a rank's actions ("F3.1": stage 3, micro-batch 1, when the rank holds
/// several stages), for messages and tests.
std::string describe_actions(const PartitionSchedule& schedule, int rank);

}  // namespace flowtrain::train
