#pragma once

// Helpers for tests that run the flowtrain CLI (FLOWTRAIN_CLI) as a user would, with
// --nproc for several ranks, and compare the checkpoints it writes.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "stages/train/files/checkpoint.hpp"
#include "tests/process.hpp"

namespace flowtrain::testing {

// Runs `flowtrain run args...` to completion (its output in a log file under the temp folder).
inline Exit run_cli(std::vector<std::string> args) {
  args.insert(args.begin(), {FLOWTRAIN_CLI, "run"});
  static int runs = 0;
  return wait_for(spawn(args, {},
                        std::filesystem::temp_directory_path() /
                            ("flowtrain-cli-" + std::to_string(::getpid()) + "-" +
                             std::to_string(runs++) + ".log")),
                  300);
}

// The largest absolute difference between the weights of two checkpoints.
inline double max_weight_difference(const std::string& a_path, const std::string& b_path) {
  const train::ImageModel a = train::load_model(train::read_checkpoint(a_path));
  const train::ImageModel b = train::load_model(train::read_checkpoint(b_path));
  const auto pa = a->named_parameters(), pb = b->named_parameters();
  REQUIRE(pa.size() == pb.size());
  double worst = 0;
  for (const auto& item : pa) {
    worst = std::max(worst, (item.value() - pb[item.key()]).abs().max().item<double>());
  }
  return worst;
}

// A number printed in rank 0's report, e.g. "optimizer_state_mb 1.23".
inline double printed(const std::string& log, const std::string& name) {
  std::smatch m;
  REQUIRE(std::regex_search(log, m, std::regex(name + " ([0-9.e+-]+)")));
  return std::stod(m[1]);
}

}  // namespace flowtrain::testing
