#include "stages/util/route_every.hpp"

namespace flowtrain::stages {

RouteEveryStage::RouteEveryStage(const Options& options)
    : every_(static_cast<std::uint64_t>(options.every)) {}

StageDoc RouteEveryStage::describe() {
  return {"A router: each item whose sequence number is a multiple of `every` goes to output "
          "`picked`, the others to `rest` (take them as `NAME.picked`, `NAME.rest`).",
          option_specs<Options>()};
}

std::optional<Routed<std::uint64_t>> RouteEveryStage::process(std::uint64_t&& value,
                                                              ItemContext& ctx) {
  return Routed<std::uint64_t>{ctx.seq() % every_ == 0 ? 0u : 1u, value};
}

FLOWTRAIN_REGISTER_STAGE("route_every", RouteEveryStage);

}  // namespace flowtrain::stages
