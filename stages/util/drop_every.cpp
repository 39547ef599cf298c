#include "stages/util/drop_every.hpp"

#include <string>

namespace flowtrain::stages {

DropEveryStage::DropEveryStage(const Params& params)
    : every_(static_cast<std::uint64_t>(params.get_int("every"))) {}

StageDoc DropEveryStage::describe() {
  return {"Drops each item whose sequence number is a multiple of `every`, reporting why.",
          {int_param("every", 0, "drop items 0, every, 2*every, ... (0: drop none)", 0)}};
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
