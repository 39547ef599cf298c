# System libraries only (Debian packages; see scripts/install-deps).
find_package(TBB REQUIRED)
find_package(yaml-cpp REQUIRED)
find_package(Threads REQUIRED)
find_package(CLI11 REQUIRED)
if(FLOWTRAIN_BUILD_TESTS)
  find_package(doctest REQUIRED)
  include(doctest)  # doctest_discover_tests
endif()
