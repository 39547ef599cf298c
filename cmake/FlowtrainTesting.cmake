# flowtrain_add_test_binary(NAME SOURCES... LIBS...): one doctest binary of several test files,
# each TEST_CASE registered with ctest by doctest's own discovery.
function(flowtrain_add_test_binary name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE doctest::doctest ${ARG_LIBS} flowtrain_warnings)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR})
  doctest_discover_tests(${name} PROPERTIES TIMEOUT 120)
endfunction()
