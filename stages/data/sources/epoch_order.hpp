#pragma once

// The sampler every dataset source shares: which indices a rank visits in each epoch
// (EpochOrder, as PyTorch's DistributedSampler), the options that set it (SourceOptions) and
// what they resolve to for this rank (SourcePlan), and the walk over the epochs that resumes
// (EpochCursor).

#include <cstddef>
#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <vector>

#include "distributed/job.hpp"
#include "graph/options.hpp"

namespace flowtrain::data {

/// Fisher-Yates shuffle of `items` with an unbiased bounded draw by rejection, so that a seed
/// gives the same order with every standard library (std::shuffle and
/// std::uniform_int_distribution differ between them).
template <class T>
void portable_shuffle(std::vector<T>& items, std::mt19937_64& rng) {
  for (std::size_t i = items.size(); i > 1; --i) {
    const std::uint64_t range = i;
    const std::uint64_t threshold = (0 - range) % range;  // 2^64 mod range
    std::uint64_t x = rng();
    while (x < threshold) x = rng();
    std::swap(items[i - 1], items[x % range]);
  }
}

/// What to do with the remainder when the dataset does not split evenly across ranks.
enum class Uneven {
  kPad,   // every rank gets ceil(n / world_size): repeat samples from the start of the order
  kDrop,  // every rank gets floor(n / world_size): leave out the tail of the order
  kSplit,  // every sample once: ranks below n % world_size get one more (evaluation: the ranks
           // run no collective per step, so their counts may differ)
};

/// A config's names of them (param uneven): pad, drop, split.
inline std::span<const EnumName<Uneven>> enum_names(Uneven) {
  static constexpr EnumName<Uneven> names[] = {
      {Uneven::kPad, "pad"}, {Uneven::kDrop, "drop"}, {Uneven::kSplit, "split"}};
  return names;
}

/// The indices one rank visits in one epoch, as PyTorch's DistributedSampler: the whole index is
/// shuffled with a generator seeded from seed + epoch (the same on every rank), padded or
/// truncated to a multiple of world_size, and rank r takes positions r, r + world_size, ...
/// (split: neither, so the ranks' counts differ by up to one).
/// So the ranks of one epoch see each sample exactly once (pad: plus the repeated padding), and
/// the order depends on (seed, epoch) alone. Shuffle uses mt19937_64 and its own bounded draw,
/// so it is the same with every standard library.
class EpochOrder {
 public:
  struct Options {
    std::uint64_t seed = 0;
    bool shuffle = true;
    std::size_t rank = 0;
    std::size_t world_size = 1;
    Uneven uneven = Uneven::kPad;
  };

  /// Throws Error unless world_size >= 1 and rank < world_size.
  EpochOrder(std::size_t size, Options options);

  /// Dataset indices this rank visits in `epoch`, in visiting order, from position `start` of
  /// the epoch's shared order on: positions start + rank, start + rank + world_size, ... of the
  /// padded or truncated order; per_rank(start) of them. A start other than 0 is where a job
  /// resumed on another number of ranks takes up an epoch begun by the others (the rest of the
  /// order is padded or truncated as a whole epoch would be).
  std::vector<std::uint64_t> indices(std::uint32_t epoch, std::size_t start = 0) const;

  /// Samples per rank and epoch: ceil(size / world_size) with kPad, floor with kDrop, either
  /// with kSplit.
  std::size_t per_rank() const { return per_rank_; }
  /// The same of the rest of an epoch from position `start` of its shared order on.
  std::size_t per_rank(std::size_t start) const;
  std::size_t size() const { return size_; }
  const Options& options() const { return options_; }

 private:
  std::size_t size_;
  Options options_;
  std::size_t per_rank_;
};

/// The options every dataset source shares, after its location (the dataset's path param): its
/// params epochs, seed, shuffle, rank, world_size, ranks_per_shard, uneven and limit. The one
/// declaration of them and their defaults; source_plan resolves them for this rank.
struct SourceOptions {
  std::int64_t epochs = 1;
  std::int64_t seed = 0;
  bool shuffle = true;
  std::int64_t rank = -1;
  std::int64_t world_size = 0;
  std::int64_t ranks_per_shard = 1;
  Uneven uneven = Uneven::kPad;
  std::int64_t limit = 0;
  template <class Declare>
  void declare(Declare& d) {
    d(epochs, "epochs", "passes over the dataset", {.min = 1});
    d(seed, "seed", "shuffle seed; the order depends on (seed, epoch) only", {.min = 0});
    d(shuffle, "shuffle", "shuffle the order each epoch");
    d(rank, "rank",
      "this process's rank in data-parallel training (-1: from the launcher's environment, RANK "
      "or SLURM_PROCID; 0 without one)",
      {.min = -1});
    d(world_size, "world_size",
      "number of data-parallel ranks (0: from the launcher's environment, WORLD_SIZE or "
      "SLURM_NTASKS; 1 without one)",
      {.min = 0});
    d(ranks_per_shard, "ranks_per_shard",
      "ranks that read the same samples: the launcher's ranks r and r' share a shard when "
      "r / ranks_per_shard = r' / ranks_per_shard (set it to train_step's partitions when the "
      "model is split across ranks; every rank of a pipeline needs each batch)",
      {.min = 1, .max = 1 << 20});
    d(uneven, "uneven",
      "dataset not divisible by world_size: pad (repeat samples so every rank gets "
      "ceil(n/world_size)), drop (floor(n/world_size) each) or split (every sample once, the "
      "ranks' counts differing by up to one: for evaluation, where pad would count a sample "
      "twice; a training step's all-reduce needs equal counts)");
    d(limit, "limit", "use only the first N entries of the dataset (0: all)", {.min = 0});
  }
};

/// What a dataset source walks, resolved from its SourceOptions for this rank (source_plan): the
/// epochs, the limit, and this rank's place in each epoch's order.
struct SourcePlan {
  std::uint32_t epochs = 1;
  std::size_t limit = 0;  // use the first `limit` entries only; 0: all
  EpochOrder::Options order;

  /// The dataset size a source uses: `size`, or `limit` if that is smaller and not 0.
  std::size_t limited(std::size_t size) const;
};

/// Checks `options` (configs check the declared minimums when read; stages built from C++ get
/// the same checks here) and resolves rank and world_size from the job's placement where not
/// given; errors name the param (the pipeline builder adds the config location and stage).
SourcePlan source_plan(const SourceOptions& options, const JobPlacement& job);

/// Walks epoch 0 .. epochs-1 of this rank's EpochOrder: the iteration every dataset source
/// shares. One epoch's index list is held at a time, computed when the epoch starts.
///
/// Where a run stands is said two ways. The ordinal counts this rank's items; it suits a resume
/// on the same ranks. The shared position, epoch x size + the items of that epoch's shared order
/// the ranks took together, is the same on every rank and means the same on any number of
/// ranks: a job resumed on another number takes up the epoch there (seek_shared).
class EpochCursor {
 public:
  struct Position {
    std::uint64_t index = 0;  // dataset index
    std::uint32_t epoch = 0;
  };

  /// `size` is the dataset size after the limit.
  EpochCursor(std::size_t size, const SourcePlan& plan);

  /// The next position, or std::nullopt after the last epoch.
  std::optional<Position> next();

  /// Skips to ordinal `ordinal` of the run (what a resumed run already consumed): the next
  /// position is the one next() would have returned after `ordinal` calls. Returns false (and
  /// changes nothing) if `ordinal` is past the end. Only the epoch it lands in is shuffled.
  bool seek(std::uint64_t ordinal);

  /// Skips to shared position `position`, on this run's ranks: this rank visits its share of
  /// the rest of that epoch (EpochOrder::indices from there), then the later epochs whole.
  /// Returns false (and changes nothing) if `position` is past the end. On the ranks that
  /// reached it, the same as seek() to the ordinal they had.
  bool seek_shared(std::uint64_t position);

  /// The shared position once every rank has taken its items up to ordinal `ordinal` (from
  /// where this run began, a seek included): std::nullopt with uneven: split, whose ranks take
  /// different counts. A finished epoch is the next one's start.
  std::optional<std::uint64_t> shared_position(std::uint64_t ordinal) const;

  /// Items this rank produces over the run: the ordinal after the last one.
  std::uint64_t total() const;
  /// Positions returned so far (including skipped ones): the ordinal of the next one.
  std::uint64_t ordinal() const { return ordinal_; }

 private:
  // The epoch the run begins in, maybe part-way (after a seek): from position `start` of its
  // shared order, numbered from `ordinal`. The epochs after it are whole.
  struct FirstEpoch {
    std::uint64_t ordinal = 0;
    std::uint32_t epoch = 0;
    std::size_t start = 0;
  };
  void begin_at(const FirstEpoch& first);
  // The items this rank takes of that first epoch.
  std::uint64_t first_count() const {
    return first_.epoch < epochs_ ? order_.per_rank(first_.start) : 0;
  }

  EpochOrder order_;
  std::uint32_t epochs_;
  FirstEpoch first_;
  std::uint32_t next_epoch_ = 0;  // the epoch whose indices load next
  std::vector<std::uint64_t> indices_;
  std::size_t pos_ = 0;
  std::uint64_t ordinal_ = 0;
};

}  // namespace flowtrain::data
