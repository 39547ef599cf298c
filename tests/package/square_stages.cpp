// A plugin of the user's own stages, built against the installed package with
// flowtrain_add_plugin: the installed flowtrain runs them from YAML (cmake/CheckPackage.cmake).
#include <cstdint>
#include <optional>
#include <vector>

#include "graph/registry.hpp"

namespace consumer {

// `square`: n -> n * n.
class SquareStage final : public flowtrain::Map<std::uint64_t, std::uint64_t> {
 public:
  using Options = flowtrain::NoOptions;
  explicit SquareStage(const Options& = {}) {}
  static flowtrain::StageDoc describe() { return {"Emits the square of each number.", {}}; }

 protected:
  std::optional<std::uint64_t> process(std::uint64_t&& n, flowtrain::ItemContext&) override {
    return n * n;
  }
};

// `sum`: adds up what it takes; reports it as its result `sum`.
class SumStage final : public flowtrain::SerialSink<std::uint64_t> {
 public:
  using Options = flowtrain::NoOptions;
  explicit SumStage(const Options& = {}) {}
  static flowtrain::StageDoc describe() { return {"Adds up its items (result: sum).", {}}; }
  std::vector<flowtrain::StageResult> results() const override {
    return {{"sum", static_cast<double>(sum_)}};
  }

 protected:
  void consume(std::uint64_t&& n, flowtrain::ItemContext&) override { sum_ += n; }

 private:
  std::uint64_t sum_ = 0;
};

FLOWTRAIN_REGISTER_STAGE("square", SquareStage);
FLOWTRAIN_REGISTER_STAGE("sum", SumStage);

}  // namespace consumer
