#include "stages/data/transforms/recipe.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>
#include <variant>

#include "stages/data/splitmix.hpp"

namespace flowtrain::data {

namespace {

std::uint64_t mix_text(std::uint64_t h, std::string_view text) {
  return hash_bytes({reinterpret_cast<const std::uint8_t*>(text.data()), text.size()}, h);
}

template <class T>
std::uint64_t mix_value(std::uint64_t h, const T& v) {
  std::uint8_t bytes[sizeof v];
  std::memcpy(bytes, &v, sizeof v);
  return hash_bytes(bytes, h);
}

}  // namespace

std::uint64_t mix_recipe(std::uint64_t recipe,
                         std::string_view what,
                         const Params& params,
                         std::initializer_list<std::string_view> skip) {
  std::uint64_t h = mix_text(recipe, what);
  for (const auto& [name, value] : params.values()) {  // a std::map: always the same order
    if (std::find(skip.begin(), skip.end(), name) != skip.end()) continue;
    h = mix_text(h, name);
    h = std::visit(
        [h](const auto& v) {
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, std::string>) {
            return mix_text(h, v);
          } else if constexpr (std::is_same_v<T, std::vector<double>>) {
            std::uint64_t out = mix_value(h, v.size());
            for (double x : v) out = mix_value(out, x);
            return out;
          } else {
            return mix_value(h, v);
          }
        },
        value);
  }
  return h;
}

}  // namespace flowtrain::data
