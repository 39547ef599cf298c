#include <doctest/doctest.h>

#include "graph/config.hpp"
#include "graph/registry.hpp"

using namespace flowtrain;

TEST_CASE("Registry.Builtins.EveryBuiltinStageIsRegistered") {
  // The stage library registers its stages when it loads; a link that dropped it, or a stage
  // whose registrar was lost, fails here.
  for (const char* type :
       {"sequence", "spin", "drop_every", "route_every", "merge", "batch", "discard"}) {
    CAPTURE(type);
    const StageInfo* info = Registry::global().find(type);
    REQUIRE(info != nullptr);
    CHECK(!info->doc.summary.empty());
    for (const ParamSpec& p : info->doc.params) CHECK(!p.doc.empty());
    CHECK(info->make(Params::defaults(info->doc.params), BuildContext{}) != nullptr);
  }
}

TEST_CASE("Registry.Duplicate.Rejected") {
  Registry r;
  const StageInfo info = *Registry::global().find("spin");
  r.add(info);
  CHECK_THROWS_WITH(r.add(info), "stage type 'spin' is registered twice");
}

TEST_CASE("Registry.Listing.ShowsParamsTypesDefaults") {
  const std::string text = stages_text();
  CHECK(text.find("spin  (map, takes unsigned long, emits unsigned long)") != std::string::npos);
  CHECK(text.find("rounds") != std::string::npos);
  CHECK(text.find("20000") != std::string::npos);
  const std::string md = stages_markdown();
  CHECK(md.find("| `size` | int | `32` | items per batch (at most 1048576) |") != std::string::npos);
}
