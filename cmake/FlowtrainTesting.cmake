# flowtrain_add_test_binary(NAME SOURCES... LIBS...): one doctest binary of several test files,
# each TEST_CASE registered with ctest by doctest's own discovery.
function(flowtrain_add_test_binary name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE doctest::doctest ${ARG_LIBS} flowtrain_warnings)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR})
  doctest_discover_tests(${name} PROPERTIES TIMEOUT 120)
endfunction()

# flowtrain_add_cli_test(NAME COMMAND cmd args... EXIT_CODE n MATCHES regex... [ONE_LINE]):
# runs a program as a user would and checks its exit code and that its combined output matches
# every regex.
function(flowtrain_add_cli_test name)
  cmake_parse_arguments(ARG "ONE_LINE" "EXIT_CODE" "COMMAND;MATCHES" ${ARGN})
  string(REPLACE ";" "|" _cmd "${ARG_COMMAND}")
  set(_matches "")
  list(LENGTH ARG_MATCHES _count)
  set(_i 0)
  foreach(_regex IN LISTS ARG_MATCHES)
    list(APPEND _matches "-DMATCH${_i}=${_regex}")
    math(EXPR _i "${_i} + 1")
  endforeach()
  add_test(NAME ${name}
    COMMAND ${CMAKE_COMMAND} "-DCMD=${_cmd}" "-DEXIT_CODE=${ARG_EXIT_CODE}" ${_matches}
            "-DMATCH_COUNT=${_count}" "-DONE_LINE=${ARG_ONE_LINE}"
            -P ${PROJECT_SOURCE_DIR}/cmake/RunCliTest.cmake)
  set_tests_properties(${name} PROPERTIES TIMEOUT 120)
endfunction()
