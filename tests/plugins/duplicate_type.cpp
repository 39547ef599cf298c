// A plugin whose second stage type is one flowtrain has already (`spin`): load_plugin refuses it
// with one line, and registers neither (tests/CMakeLists.txt: Cli.Plugin.*).
#include <cstdint>
#include <optional>

#include "graph/registry.hpp"

namespace {

class Echo final : public flowtrain::Map<std::uint64_t, std::uint64_t> {
 public:
  using Options = flowtrain::NoOptions;
  explicit Echo(const Options& = {}) {}
  static flowtrain::StageDoc describe() { return {"Emits what it takes.", {}}; }

 protected:
  std::optional<std::uint64_t> process(std::uint64_t&& n, flowtrain::ItemContext&) override {
    return n;
  }
};

FLOWTRAIN_REGISTER_STAGE("echo_from_a_refused_plugin", Echo);
FLOWTRAIN_REGISTER_STAGE("spin", Echo);

}  // namespace
