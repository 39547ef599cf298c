#include "stages/data/sources/dataset_source.hpp"

#include "graph/error.hpp"
#include "stages/data/splitmix.hpp"

namespace flowtrain::data {

const std::string& required_path(const std::string& path, const std::string& name) {
  if (path.empty()) throw Error("param '" + name + "' is required");
  return path;
}

bool DatasetSource::seek(std::uint64_t position) { return cursor_.seek(position); }

std::optional<Sample> DatasetSource::next() {
  const std::uint64_t position = cursor_.ordinal();
  const std::optional<EpochCursor::Position> at = cursor_.next();
  if (!at) return std::nullopt;
  Sample sample = make_sample(at->index);
  sample.index = at->index;
  sample.epoch = at->epoch;
  sample.position = position;
  sample.origin = this;
  return sample;
}

void DatasetSource::mixed_at(Sample& sample, std::uint64_t position) {
  sample.position = position;
}

Sample DatasetSource::stand_in(const Sample& bad, std::uint32_t attempt) const {
  // Drawn from (seed, epoch, index, attempt): the same on every run and rank.
  std::uint64_t index =
      splitmix64(seed_ ^ splitmix64(bad.epoch ^ splitmix64(bad.index ^ splitmix64(attempt)))) %
      size_;
  if (index == bad.index && size_ > 1) index = (index + 1) % size_;
  Sample sample = make_sample(index);
  sample.index = index;
  sample.epoch = bad.epoch;
  sample.position = bad.position;
  sample.origin = this;
  return sample;
}

}  // namespace flowtrain::data
