#include "stages/util/sequence.hpp"

namespace flowtrain::stages {

SequenceSource::SequenceSource(const Params& params)
    : next_(static_cast<std::uint64_t>(params.get_int("start"))),
      end_(next_ + static_cast<std::uint64_t>(params.get_int("count"))) {}

StageDoc SequenceSource::describe() {
  return {"Emits the integers start .. start+count-1 in order.",
          {int_param("count", 10000, "how many integers to emit", 0),
           int_param("start", 0, "the first integer", 0)}};
}

std::optional<std::uint64_t> SequenceSource::next() {
  if (next_ == end_) return std::nullopt;
  return next_++;
}

FLOWTRAIN_REGISTER_STAGE("sequence", SequenceSource);

}  // namespace flowtrain::stages
