// Compiled by ctest, not built: a misspelled option of a built-in stage must not compile
// (Api.Options.MisspelledOptionFailsToCompile), and the right spelling must
// (Api.Options.RightSpellingCompiles), so the first test fails for the right reason only.
#include "graph/pipeline.hpp"
#include "stages/util/spin.hpp"

void build(flowtrain::Pipeline& p) {
#ifdef FLOWTRAIN_MISSPELL
  const flowtrain::stages::SpinStage::Options options{.rouds = 500};
#else
  const flowtrain::stages::SpinStage::Options options{.rounds = 500};
#endif
  p.add<flowtrain::stages::SpinStage>("spin", options);
}
