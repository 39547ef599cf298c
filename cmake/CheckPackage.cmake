# Installs the build tree into a scratch prefix, imports the Python package installed there,
# then configures, builds and runs the user project in tests/package against it:
# find_package(flowtrain) must work for users.
set(prefix ${WORK}/prefix)
file(REMOVE_RECURSE ${WORK})
foreach(step
    "${CMAKE_COMMAND};--install;${BUILD};--prefix;${prefix}"
    "${CMAKE_COMMAND};-E;env;PYTHONPATH=${prefix}/${PYTHON_DIR};${PYTHON};-c;import flowtrain; assert flowtrain.stages()"
    "${CMAKE_COMMAND};-S;${SOURCE};-B;${WORK}/build;-DCMAKE_PREFIX_PATH=${prefix}"
    "${CMAKE_COMMAND};--build;${WORK}/build"
    "${WORK}/build/consumer")
  execute_process(COMMAND ${step} RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT code EQUAL 0)
    message(FATAL_ERROR "step failed (${code}): ${step}\n${out}${err}")
  endif()
endforeach()
message(STATUS "${out}")
