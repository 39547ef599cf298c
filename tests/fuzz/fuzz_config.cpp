// Config loading: YAML text through parsing, includes of nothing, interpolation, overrides and
// every stage's param validation, up to the graph and thread-budget checks `flowtrain check`
// does.
#include <string>

#include "graph/config.hpp"
#include "tests/fuzz/fuzz_target.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  return flowtrain::fuzz::only_clear_errors([&] {
    const flowtrain::RunConfig config = flowtrain::parse_run_config(text, "fuzz.yaml");
    for (const flowtrain::PipelineConfig& phase : config.phases) {
      flowtrain::check_thread_budget(phase);
      flowtrain::stage_decls(phase);
    }
  });
}
