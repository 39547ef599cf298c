#include "stages/data/sources/epoch_order.hpp"

#include <algorithm>
#include <limits>
#include <random>

#include "graph/error.hpp"

namespace flowtrain::data {

EpochOrder::EpochOrder(std::size_t size, Options options) : size_(size), options_(options) {
  if (options_.world_size < 1) throw Error("world_size must be at least 1");
  if (options_.rank >= options_.world_size) {
    throw Error("rank " + std::to_string(options_.rank) + " must be below world_size " +
                std::to_string(options_.world_size));
  }
  const std::size_t w = options_.world_size;
  switch (options_.uneven) {
    case Uneven::kPad:
      per_rank_ = (size_ + w - 1) / w;
      break;
    case Uneven::kDrop:
      per_rank_ = size_ / w;
      break;
    case Uneven::kSplit:
      per_rank_ = size_ / w + (options_.rank < size_ % w ? 1 : 0);
      break;
  }
}

std::size_t EpochOrder::per_rank(std::size_t start) const {
  if (start == 0) return per_rank_;
  const std::size_t rest = start < size_ ? size_ - start : 0;
  const std::size_t w = options_.world_size;
  switch (options_.uneven) {
    case Uneven::kPad:
      return (rest + w - 1) / w;
    case Uneven::kDrop:
      return rest / w;
    case Uneven::kSplit:
      break;
  }
  return rest / w + (options_.rank < rest % w ? 1 : 0);
}

std::vector<std::uint64_t> EpochOrder::indices(std::uint32_t epoch, std::size_t start) const {
  std::vector<std::uint64_t> out;
  const std::size_t count = per_rank(start);
  if (count == 0) return out;
  out.reserve(count);
  const std::size_t w = options_.world_size;
  const std::size_t first = start + options_.rank;
  if (!options_.shuffle) {
    for (std::size_t k = 0; k < count; ++k) out.push_back((first + k * w) % size_);
    return out;
  }
  std::vector<std::uint64_t> perm(size_);
  for (std::size_t i = 0; i < size_; ++i) perm[i] = i;
  std::mt19937_64 rng(options_.seed + epoch);
  portable_shuffle(perm, rng);
  // Position p of the padded order is perm[p % size]: padding repeats from the start.
  for (std::size_t k = 0; k < count; ++k) out.push_back(perm[(first + k * w) % size_]);
  return out;
}

std::size_t SourcePlan::limited(std::size_t size) const {
  return limit > 0 ? std::min(limit, size) : size;
}

SourcePlan source_plan(const SourceOptions& options, const JobPlacement& job) {
  auto check = [](const std::string& name, std::int64_t v, std::int64_t min, std::int64_t max) {
    if (v < min || v > max) {
      throw Error("param '" + name + "' must be in [" + std::to_string(min) + ", " +
                  std::to_string(max) + "], got " + std::to_string(v));
    }
    return v;
  };
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  SourcePlan o;
  o.epochs = static_cast<std::uint32_t>(
      check("epochs", options.epochs, 1, std::numeric_limits<std::uint32_t>::max()));
  o.limit = static_cast<std::size_t>(check("limit", options.limit, 0, kMax));
  o.order.seed = static_cast<std::uint64_t>(check("seed", options.seed, 0, kMax));
  o.order.shuffle = options.shuffle;
  const std::int64_t rank = check("rank", options.rank, -1, kMax);
  const std::int64_t world_size = check("world_size", options.world_size, 0, kMax);
  if (rank < 0 || world_size == 0) {
    const ShardGroup group = shard_group(
        job, static_cast<int>(check("ranks_per_shard", options.ranks_per_shard, 1, 1 << 20)));
    o.order.rank = static_cast<std::size_t>(rank < 0 ? group.index : rank);
    o.order.world_size = static_cast<std::size_t>(world_size == 0 ? group.count : world_size);
  } else {
    o.order.rank = static_cast<std::size_t>(rank);
    o.order.world_size = static_cast<std::size_t>(world_size);
  }
  o.order.uneven = options.uneven;
  if (o.order.rank >= o.order.world_size) {
    throw Error("param 'rank' (" + std::to_string(o.order.rank) + ") must be below world_size (" +
                std::to_string(o.order.world_size) + ")");
  }
  return o;
}

EpochCursor::EpochCursor(std::size_t size, const SourcePlan& plan)
    : order_(size, plan.order), epochs_(plan.epochs) {}

std::optional<EpochCursor::Position> EpochCursor::next() {
  while (pos_ == indices_.size()) {
    if (next_epoch_ >= epochs_ || order_.per_rank() == 0) return std::nullopt;
    indices_ = order_.indices(next_epoch_++);
    pos_ = 0;
  }
  ++ordinal_;
  return Position{indices_[pos_++], next_epoch_ - 1};
}

std::uint64_t EpochCursor::total() const {
  if (first_.epoch >= epochs_) return first_.ordinal;
  return first_.ordinal + first_count() +
         static_cast<std::uint64_t>(order_.per_rank()) * (epochs_ - first_.epoch - 1);
}

void EpochCursor::begin_at(const FirstEpoch& first) {
  first_ = first;
  indices_.clear();
  pos_ = 0;
  next_epoch_ = first.epoch;
  if (first.epoch < epochs_) indices_ = order_.indices(next_epoch_++, first.start);
  ordinal_ = first.ordinal;
}

bool EpochCursor::seek(std::uint64_t ordinal) {
  const std::uint64_t per_epoch = order_.per_rank();
  if (ordinal > total()) return false;
  if (per_epoch == 0 || ordinal == ordinal_) return true;
  // A resume on the ranks that reached it: the epoch's order from this rank's next row on.
  const std::uint64_t epoch = ordinal / per_epoch;
  const std::uint64_t rows = ordinal % per_epoch;
  begin_at({.ordinal = ordinal,
            .epoch = static_cast<std::uint32_t>(epoch),
            .start = static_cast<std::size_t>(rows * order_.options().world_size)});
  return true;
}

bool EpochCursor::seek_shared(std::uint64_t position) {
  const std::uint64_t size = order_.size();
  if (size == 0) return position == 0;
  const std::uint64_t epoch = position / size;
  const auto start = static_cast<std::size_t>(position % size);
  if (epoch > epochs_ || (epoch == epochs_ && start > 0)) return false;
  // Numbered as seek() numbers it where the ranks that reached it resume (a whole number of
  // rows of this run's ranks); elsewhere, the count only has to run on from there.
  begin_at({.ordinal = epoch * order_.per_rank() + start / order_.options().world_size,
            .epoch = static_cast<std::uint32_t>(epoch),
            .start = start});
  return true;
}

std::optional<std::uint64_t> EpochCursor::shared_position(std::uint64_t ordinal) const {
  if (order_.options().uneven == Uneven::kSplit || ordinal < first_.ordinal) return std::nullopt;
  const std::uint64_t size = order_.size();
  const std::uint64_t ranks = order_.options().world_size;
  std::uint64_t taken = ordinal - first_.ordinal;  // by this rank, and so by each
  const std::uint64_t first = first_count();
  if (taken < first) return first_.epoch * size + first_.start + taken * ranks;
  if (first_.epoch >= epochs_) return first_.epoch * size;  // began at the end
  // Past the first epoch: whole epochs of per_rank() items each.
  taken -= first;
  const std::uint64_t per_epoch = std::max<std::uint64_t>(order_.per_rank(), 1);
  return (first_.epoch + 1 + taken / per_epoch) * size + taken % per_epoch * ranks;
}

}  // namespace flowtrain::data
