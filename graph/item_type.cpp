#include "graph/item_type.hpp"

#include <cxxabi.h>

#include <cstdlib>
#include <memory>
#include <utility>

namespace flowtrain {

namespace {
std::string demangle_raw(const char* mangled) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> out(abi::__cxa_demangle(mangled, nullptr, nullptr, &status),
                                             std::free);
  std::string name = (status == 0 && out) ? out.get() : mangled;
  // The standard library's inline namespace and spelled-out std::string only add noise.
  const std::pair<std::string, std::string> noise[] = {
      {"std::__cxx11::", ""},
      {"std::basic_string<char, std::char_traits<char>, std::allocator<char> >", "std::string"}};
  for (const auto& [from, to] : noise) {
    for (auto pos = name.find(from); pos != std::string::npos; pos = name.find(from, pos)) {
      name.replace(pos, from.size(), to);
    }
  }
  return name;
}
}  // namespace

std::string demangle(const std::type_info& type) { return demangle_raw(type.name()); }

std::string ItemType::demangle_index(std::type_index index) { return demangle_raw(index.name()); }

}  // namespace flowtrain
