// dist_tests: the World and the local launcher across real processes. The test binary starts
// copies of itself as ranks: with FLOWTRAIN_DIST_TEST_CHILD=<mode> set it runs that child mode
// (test_world.cpp) instead of the tests.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdlib>
#include <string>

namespace flowtrain::testing {
int run_child(const std::string& mode);
}

int main(int argc, char** argv) {
  if (const char* mode = std::getenv("FLOWTRAIN_DIST_TEST_CHILD")) {
    return flowtrain::testing::run_child(mode);
  }
  doctest::Context context(argc, argv);
  return context.run();
}
