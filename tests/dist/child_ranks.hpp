#pragma once

// The dist_tests binary starts copies of itself as ranks (FLOWTRAIN_DIST_TEST_CHILD=<mode>);
// the modes are run by run_child (test_world.cpp).
#include <functional>
#include <string>
#include <vector>

#include "tests/process.hpp"

namespace flowtrain::testing {

/// Starts ranks 0..size-1 of child `mode` on a fresh loopback port, each with `extra(rank)` in
/// its environment and its output in a log named after `test`.
std::vector<Process> start_ranks(const std::string& test,
                                 const std::string& mode,
                                 int size,
                                 const std::function<std::vector<std::string>(int)>& extra);

/// Child mode "grad_sync" (test_grad_sync.cpp).
int child_grad_sync();

}  // namespace flowtrain::testing
