#pragma once

#include <atomic>

namespace flowtrain {

class Pipeline;

/// A stop the ranks of a job take together, after the same step. Stopping a rank's pipeline on
/// its own signal would let each rank finish the batches it happened to have in flight, a
/// different number on each, and a rank waiting in a collective the others never join fails.
/// So while a stage that can agree holds the vote (a data-parallel gradient sync, which
/// exchanges it once a step), StopOnSignal casts the signal as this rank's vote instead of
/// stopping the pipeline; the holder exchanges the votes, and once one rank voted every rank
/// calls agreed() after the same step, which stops its pipeline. Nobody holding it, a signal
/// stops the pipeline at once. Every member may be called from a signal handler.
class StopVote {
 public:
  /// Held while a stage can exchange the votes (counted; a stage releases what it held).
  void hold() noexcept { holders_.fetch_add(1); }
  void release() noexcept { holders_.fetch_sub(1); }
  bool held() const noexcept { return holders_.load() > 0; }

  /// This rank's vote: the signal it got (SIGINT, SIGTERM), 0 for none.
  void cast(int signal) noexcept { vote_.store(signal); }
  int vote() const noexcept { return vote_.load(); }

  /// The ranks agreed to stop now, for `signal` (the largest any rank voted): stops this rank's
  /// pipeline (the one StopOnSignal watches), which ends once the batches in flight are passed
  /// over.
  void agreed(int signal) noexcept;
  /// The signal the ranks agreed to stop for, or 0.
  int agreed_signal() const noexcept { return agreed_.load(); }

 private:
  friend class StopOnSignal;
  std::atomic<int> holders_{0};
  std::atomic<int> vote_{0};
  std::atomic<int> agreed_{0};
  std::atomic<Pipeline*> pipeline_{nullptr};
};

}  // namespace flowtrain
