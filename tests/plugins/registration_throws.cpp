// A plugin whose second registrar throws (its stage's describe(), as one reading a file it
// lacks would): load_plugin refuses it with one line naming the type and the reason, and
// registers neither (tests/graph/test_plugin.cpp).
#include <cstdint>
#include <optional>
#include <stdexcept>

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

class Unready final : public flowtrain::Map<std::uint64_t, std::uint64_t> {
 public:
  using Options = flowtrain::NoOptions;
  explicit Unready(const Options& = {}) {}
  static flowtrain::StageDoc describe() {
    throw std::runtime_error("no vocabulary file next to the plugin");
  }

 protected:
  std::optional<std::uint64_t> process(std::uint64_t&& n, flowtrain::ItemContext&) override {
    return n;
  }
};

FLOWTRAIN_REGISTER_STAGE("echo_before_a_throwing_one", Echo);
FLOWTRAIN_REGISTER_STAGE("unready", Unready);

}  // namespace
