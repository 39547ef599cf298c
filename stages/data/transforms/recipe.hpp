#pragma once

#include <cstdint>
#include <initializer_list>
#include <string_view>

#include "graph/options.hpp"

namespace flowtrain::data {

/// Mixes the params a stage shapes pixels with into a pixel recipe (Sample::recipe): `what`
/// (the stage, or the option group) and every param of `params` but those named in `skip`.
/// Two runs whose stages make the same pixels from the same view get the same recipe.
///
///   recipe_ = mix_recipe(0, "decode_crop", to_params(options.normalize));
std::uint64_t mix_recipe(std::uint64_t recipe,
                         std::string_view what,
                         const Params& params,
                         std::initializer_list<std::string_view> skip = {});

}  // namespace flowtrain::data
