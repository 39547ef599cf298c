// A user's own project: finds the installed flowtrain package and runs a config-built pipeline.
#include <iostream>

#include "graph/config.hpp"

int main() {
  const auto config = flowtrain::parse_pipeline_config(
      "stages: [{type: sequence, params: {count: 5}}, {type: discard}]", "inline");
  const auto report = flowtrain::build_pipeline(config)->run({.threads = 1});
  std::cout << "consumer ran " << report.stages.back().items_in << " items\n";
}
