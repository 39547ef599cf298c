#include "stages/util/sequence.hpp"

namespace flowtrain::stages {

SequenceSource::SequenceSource(const Options& options)
    : next_(static_cast<std::uint64_t>(options.start)),
      end_(next_ + static_cast<std::uint64_t>(options.count)) {}

StageDoc SequenceSource::describe() {
  return {"Emits the integers start .. start+count-1 in order.",
          option_specs<Options>()};
}

std::optional<std::uint64_t> SequenceSource::next() {
  if (next_ == end_) return std::nullopt;
  return next_++;
}

FLOWTRAIN_REGISTER_STAGE("sequence", SequenceSource);

}  // namespace flowtrain::stages
