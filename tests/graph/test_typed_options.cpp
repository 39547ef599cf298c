#include <doctest/doctest.h>

#include <span>
#include <string>
#include <vector>

#include "graph/error.hpp"
#include "graph/options.hpp"

using namespace flowtrain;

namespace {

// A value with two spellings of one choice: the first is how it is written back.
enum class Level { kNone, kSome, kAll };
std::span<const EnumName<Level>> enum_names(Level) {
  static constexpr EnumName<Level> names[] = {
      {Level::kNone, "none"}, {Level::kSome, "some"}, {Level::kAll, "all"}, {Level::kNone, "off"}};
  return names;
}

struct LevelOptions {
  Level level = Level::kSome;
  std::vector<double> blocks = {2, 2};
  std::vector<double> scale = {0.5, 1.0};
  template <class Declare>
  void declare(Declare& d) {
    d(level, "level", "how much");
    d(blocks, "blocks", "blocks per stage", {.type = ParamType::kIntList});
    d(scale, "scale", "a range");
  }
};

const ParamSpec& spec_of(const std::string& name) {
  static const std::vector<ParamSpec> specs = option_specs<LevelOptions>();
  for (const ParamSpec& spec : specs) {
    if (spec.name == name) return spec;
  }
  FAIL("no param " << name);
  throw;
}

}  // namespace

// An enum option is declared by its type alone: a config spells it by name, any other name is
// refused with the names allowed, and C++ reads the enum, parsed once.
TEST_CASE("Options.Enum.NamesAreTheChoicesAndParseOnce") {
  const ParamSpec& level = spec_of("level");
  CHECK(level.type == ParamType::kString);
  CHECK(level.choices == std::vector<std::string>{"none", "some", "all", "off"});
  CHECK(level.default_value == ParamValue(std::string("some")));
  CHECK(value_problem(level, std::string("most")) ==
        "must be one of none, some, all, off, got 'most'");

  Params params = to_params(LevelOptions{});
  params.set("level", std::string("off"));  // an alias of kNone
  const LevelOptions read = options_from<LevelOptions>(params);
  CHECK(read.level == Level::kNone);
  CHECK(to_params(read).get_string("level") == "none");  // written back by its first name
  CHECK(enum_name(Level::kAll) == std::string("all"));
  CHECK(enum_value<Level>("all", "param 'level'") == Level::kAll);
  CHECK_THROWS_WITH_AS(enum_value<Level>("most", "param 'level'"),
                       "param 'level' must be one of none, some, all, off, got 'most'", Error);
}

// An integer list is typed as one (docs/config.md says "int list"), and holds whole numbers.
TEST_CASE("Options.IntList.WholeNumbersOnly") {
  CHECK(spec_of("blocks").type == ParamType::kIntList);
  CHECK(std::string(to_string(ParamType::kIntList)) == "int list");
  CHECK(spec_of("scale").type == ParamType::kFloatList);
  CHECK(value_problem(spec_of("blocks"), std::vector<double>{2, 3}).empty());
  CHECK(value_problem(spec_of("blocks"), std::vector<double>{2, 2.5}) ==
        "must hold whole numbers, got 2.5");
  CHECK(value_problem(spec_of("scale"), std::vector<double>{0.25, 1}).empty());
}
