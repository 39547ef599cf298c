#include "stages/train/partitioned/schedule.hpp"

#include <algorithm>
#include <optional>

#include "graph/error.hpp"

namespace flowtrain::train {

namespace {

using Kind = PartitionAction::Kind;

PartitionAction forward(int stage, int microbatch) { return {Kind::kForward, stage, microbatch}; }
PartitionAction backward(int stage, int microbatch) { return {Kind::kBackward, stage, microbatch}; }

// Megatron's interleaved 1F1B for one rank: microstep k of the rank's M x V forwards (and
// backwards) is micro-batch (k / (P V)) P + k % P of its chunk (k / P) % V, backwards taking
// the chunks in reverse; a warm-up of forwards, then one forward and one backward in turn.
std::vector<PartitionAction> interleaved(int rank, int ranks, int microbatches, int chunks) {
  const int total = microbatches * chunks;
  const auto microbatch = [&](int k) { return (k / (ranks * chunks)) * ranks + k % ranks; };
  const auto forward_stage = [&](int k) { return ((k / ranks) % chunks) * ranks + rank; };
  const auto backward_stage = [&](int k) {
    return (chunks - 1 - (k / ranks) % chunks) * ranks + rank;
  };
  const int warmup = microbatches == ranks
                         ? total
                         : std::min((ranks - rank - 1) * 2 + (chunks - 1) * ranks, total);
  std::vector<PartitionAction> out;
  for (int k = 0; k < warmup; ++k) out.push_back(forward(forward_stage(k), microbatch(k)));
  for (int k = 0; k < total - warmup; ++k) {
    out.push_back(forward(forward_stage(warmup + k), microbatch(warmup + k)));
    out.push_back(backward(backward_stage(k), microbatch(k)));
  }
  for (int k = total - warmup; k < total; ++k) {
    out.push_back(backward(backward_stage(k), microbatch(k)));
  }
  return out;
}

}  // namespace

PartitionSchedule make_partition_schedule(PartitionScheduleKind kind,
                                          int ranks,
                                          int microbatches,
                                          int chunks_per_partition) {
  if (ranks < 1 || microbatches < 1 || chunks_per_partition < 1) {
    throw Error("a pipeline needs at least 1 rank, 1 micro-batch and 1 stage per rank (got " +
                std::to_string(ranks) + ", " + std::to_string(microbatches) + ", " +
                std::to_string(chunks_per_partition) + ")");
  }
  if (kind != PartitionScheduleKind::kInterleaved && chunks_per_partition != 1) {
    throw Error(std::string("schedule ") + to_string(kind) +
                " holds one stage per rank; chunks_per_partition is for the interleaved schedule");
  }
  if (kind == PartitionScheduleKind::kInterleaved && microbatches % ranks != 0) {
    throw Error("the interleaved schedule needs micro-batches in multiples of the ranks (" +
                std::to_string(microbatches) + " micro-batches, " + std::to_string(ranks) +
                " ranks)");
  }
  PartitionSchedule s{kind, ranks, ranks * chunks_per_partition, microbatches, {}};
  for (int r = 0; r < ranks; ++r) {
    std::vector<PartitionAction>& out = s.actions.emplace_back();
    switch (kind) {
      case PartitionScheduleKind::kGPipe:
        for (int m = 0; m < microbatches; ++m) out.push_back(forward(r, m));
        for (int m = 0; m < microbatches; ++m) out.push_back(backward(r, m));
        break;
      case PartitionScheduleKind::k1F1B: {
        // Forwards for the stages after this one to fill, then one forward, one backward.
        const int warmup = std::min(ranks - r - 1, microbatches);
        for (int m = 0; m < warmup; ++m) out.push_back(forward(r, m));
        for (int m = 0; m < microbatches - warmup; ++m) {
          out.push_back(forward(r, warmup + m));
          out.push_back(backward(r, m));
        }
        for (int m = microbatches - warmup; m < microbatches; ++m) out.push_back(backward(r, m));
        break;
      }
      case PartitionScheduleKind::kInterleaved:
        out = interleaved(r, ranks, microbatches, chunks_per_partition);
        break;
    }
  }
  return s;
}

PartitionTimeline simulate_pipeline(const PartitionSchedule& schedule,
                                    double forward_cost,
                                    double backward_cost) {
  const int stages = schedule.stages, m = schedule.microbatches;
  constexpr double kNotYet = -1;
  // When each forward and backward of each (stage, micro-batch) ends.
  std::vector<double> forward_end(static_cast<std::size_t>(stages * m), kNotYet);
  std::vector<double> backward_end = forward_end;
  const auto at = [&](int stage, int microbatch) {
    return static_cast<std::size_t>(stage * m + microbatch);
  };
  PartitionTimeline out;
  out.spans.resize(schedule.actions.size());
  std::vector<std::size_t> next(schedule.actions.size(), 0);
  std::vector<double> free_at(schedule.actions.size(), 0);
  double busy = 0;
  for (bool progress = true; progress;) {
    progress = false;
    for (std::size_t r = 0; r < schedule.actions.size(); ++r) {
      while (next[r] < schedule.actions[r].size()) {
        const PartitionAction& a = schedule.actions[r][next[r]];
        // The input it waits for: the previous stage's forward, or the next stage's backward
        // (and its own forward).
        std::optional<double> ready = 0.0;
        const auto needs = [&](double end) {
          if (end == kNotYet) ready.reset();
          if (ready) ready = std::max(*ready, end);
        };
        if (a.kind == Kind::kForward) {
          if (a.stage > 0) needs(forward_end[at(a.stage - 1, a.microbatch)]);
        } else {
          needs(forward_end[at(a.stage, a.microbatch)]);
          if (a.stage + 1 < stages) needs(backward_end[at(a.stage + 1, a.microbatch)]);
        }
        if (!ready) break;
        const double cost = a.kind == Kind::kForward ? forward_cost : backward_cost;
        const double start = std::max(free_at[r], *ready);
        free_at[r] = start + cost;
        (a.kind == Kind::kForward ? forward_end : backward_end)[at(a.stage, a.microbatch)] =
            free_at[r];
        out.spans[r].emplace_back(start, free_at[r]);
        busy += cost;
        ++next[r];
        progress = true;
      }
    }
  }
  std::string stuck;
  for (std::size_t r = 0; r < schedule.actions.size(); ++r) {
    out.makespan = std::max(out.makespan, free_at[r]);
    if (next[r] == schedule.actions[r].size()) continue;
    const PartitionAction& a = schedule.actions[r][next[r]];
    stuck += std::string(stuck.empty() ? "" : "; ") + "rank " + std::to_string(r) +
             " at its action " + std::to_string(next[r] + 1) + " (" +
             (a.kind == Kind::kForward ? "forward" : "backward") + " of stage " +
             std::to_string(a.stage) + ", micro-batch " + std::to_string(a.microbatch) + ")";
  }
  if (!stuck.empty()) {
    throw Error("pipeline schedule " + std::string(to_string(schedule.kind)) +
                " deadlocks: waiting forever are " + stuck);
  }
  out.bubble = out.makespan > 0
                   ? 1 - busy / (static_cast<double>(schedule.actions.size()) * out.makespan)
                   : 0;
  // A rank runs its actions in order, so counting along them follows each of its stages in time.
  out.peak_in_flight.assign(static_cast<std::size_t>(stages), 0);
  std::vector<int> in_flight(static_cast<std::size_t>(stages), 0);
  for (const std::vector<PartitionAction>& actions : schedule.actions) {
    for (const PartitionAction& a : actions) {
      int& n = in_flight[static_cast<std::size_t>(a.stage)];
      n += a.kind == Kind::kForward ? 1 : -1;
      int& peak = out.peak_in_flight[static_cast<std::size_t>(a.stage)];
      peak = std::max(peak, n);
    }
  }
  return out;
}

double textbook_bubble(int stages, int microbatches) {
  return static_cast<double>(stages - 1) / static_cast<double>(microbatches + stages - 1);
}

std::string describe_action(const PartitionSchedule& schedule, const PartitionAction& action) {
  std::string out(1, action.kind == Kind::kForward ? 'F' : 'B');
  if (schedule.stages > schedule.ranks) out += std::to_string(action.stage) + ".";
  return out + std::to_string(action.microbatch);
}

std::string describe_actions(const PartitionSchedule& schedule, int rank) {
  std::string out;
  for (const PartitionAction& a : schedule.actions[static_cast<std::size_t>(rank)]) {
    if (!out.empty()) out += ' ';
    out += describe_action(schedule, a);
  }
  return out;
}

}  // namespace flowtrain::train
