#pragma once

// A stage's named result in a run report, for tests that check what a stage counted.

#include <doctest/doctest.h>

#include <string>

#include "graph/report.hpp"

namespace flowtrain::testing {

// The value of result `name` of stage `stage` in a report; fails the test if missing.
inline double result(const RunReport& report, const std::string& stage, const std::string& name) {
  for (const StageReport& s : report.stages) {
    if (s.name != stage) continue;
    for (const StageResult& r : s.results) {
      if (r.name == name) return r.value;
    }
  }
  FAIL("no result '" << name << "' from stage '" << stage << "'");
  return 0;
}

}  // namespace flowtrain::testing
