#include "stages/util/route_every.hpp"

namespace flowtrain::stages {

RouteEveryStage::RouteEveryStage(const Params& params)
    : every_(static_cast<std::uint64_t>(params.get_int("every"))) {}

StageDoc RouteEveryStage::describe() {
  return {"A router: each item whose sequence number is a multiple of `every` goes to output "
          "`picked`, the others to `rest` (take them as `NAME.picked`, `NAME.rest`).",
          {int_param("every", 2, "route items 0, every, 2*every, ... to `picked`", 1)}};
}

std::optional<Routed<std::uint64_t>> RouteEveryStage::process(std::uint64_t&& value,
                                                              ItemContext& ctx) {
  return Routed<std::uint64_t>{ctx.seq() % every_ == 0 ? 0u : 1u, value};
}

FLOWTRAIN_REGISTER_STAGE("route_every", RouteEveryStage);

}  // namespace flowtrain::stages
