#include "stages/util/spin.hpp"

namespace flowtrain::stages {

SpinStage::SpinStage(const Options& options) : rounds_(options.rounds) {}

StageDoc SpinStage::describe() {
  return {"CPU work of a chosen cost per item (rounds of 64-bit mixing, ~4 ns each).",
          option_specs<Options>()};
}

std::uint64_t SpinStage::mix(std::uint64_t value, std::int64_t rounds) {
  for (std::int64_t r = 0; r < rounds; ++r) {  // splitmix64's finaliser
    value += 0x9e3779b97f4a7c15ULL;
    value = (value ^ (value >> 30)) * 0xbf58476d1ce4e5b9ULL;
    value = (value ^ (value >> 27)) * 0x94d049bb133111ebULL;
    value ^= value >> 31;
  }
  return value;
}

std::optional<std::uint64_t> SpinStage::process(std::uint64_t&& value, ItemContext& /*ctx*/) {
  return mix(value, rounds_);
}

FLOWTRAIN_REGISTER_STAGE("spin", SpinStage);

}  // namespace flowtrain::stages
