#include "graph/item_type.hpp"

#include <cxxabi.h>

#include <cstdlib>
#include <memory>
#include <utility>

namespace flowtrain {

namespace {
std::string demangle_raw(const char* mangled) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> out(
      abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
  std::string name = (status == 0 && out) ? out.get() : mangled;
  // The standard library's inline namespace and spelled-out std::string only add noise.
  const std::pair<std::string, std::string> noise[] = {
      {"std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> >",
       "std::string"},
      {"std::__cxx11::", ""}};
  for (const auto& [from, to] : noise) {
    for (auto pos = name.find(from); pos != std::string::npos; pos = name.find(from, pos)) {
      name.replace(pos, from.size(), to);
    }
  }
  // Default allocator arguments: "std::vector<int, std::allocator<int> >" -> "std::vector<int>".
  const std::string allocator = ", std::allocator<";
  for (auto pos = name.find(allocator); pos != std::string::npos; pos = name.find(allocator)) {
    std::size_t end = pos + allocator.size();
    for (int depth = 1; end < name.size() && depth > 0; ++end) {
      depth += name[end] == '<' ? 1 : name[end] == '>' ? -1 : 0;
    }
    while (end < name.size() && name[end] == ' ') ++end;  // the space before the closing '>'
    name.erase(pos, end - pos);
  }
  return name;
}
}  // namespace

std::string demangle(const std::type_info& type) { return demangle_raw(type.name()); }

std::string ItemType::demangle_index(std::type_index index) { return demangle_raw(index.name()); }

}  // namespace flowtrain
