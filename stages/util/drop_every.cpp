#include "stages/util/drop_every.hpp"

#include <string>

namespace flowtrain::stages {

DropEveryStage::DropEveryStage(const Options& options)
    : every_(static_cast<std::uint64_t>(options.every)) {}

StageDoc DropEveryStage::describe() {
  return {"Drops each item whose sequence number is a multiple of `every`, reporting why.",
          option_specs<Options>()};
}

std::optional<std::uint64_t> DropEveryStage::process(std::uint64_t&& value, ItemContext& ctx) {
  if (every_ > 0 && ctx.seq() % every_ == 0) {
    return ctx.drop("sequence number " + std::to_string(ctx.seq()) + " is a multiple of " +
                    std::to_string(every_));
  }
  return value;
}

FLOWTRAIN_REGISTER_STAGE("drop_every", DropEveryStage);

}  // namespace flowtrain::stages
