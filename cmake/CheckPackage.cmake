# Installs the build tree into a scratch prefix, imports the Python package installed there,
# then configures, builds and runs the user project in tests/package against it, and again
# against the build tree itself: find_package(flowtrain) must work for users. The project's plugin (libsquare_stages.so) must
# run from YAML with the installed flowtrain: by `flowtrain run --plugin`, and by a config's
# `plugins:` list (its path relative to the config, run from another folder), in the CLI and
# in Python.
set(prefix ${WORK}/prefix)
set(plugin ${WORK}/build/libsquare_stages.so)
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK}/build)
# Beside the plugin, which it names relatively: the sum of the squares of 0..4.
file(WRITE ${WORK}/build/plugin.yaml "plugins: [libsquare_stages.so]
stages:
  - {type: sequence, params: {count: 5}}
  - {type: square}
  - {type: sum}
")
# (Lines, not ';', between Python statements: a ';' would split the step's list.)
set(python_env ${CMAKE_COMMAND} -E env PYTHONPATH=${prefix}/${PYTHON_DIR} ${PYTHON})
set(all "")
foreach(step
    "${CMAKE_COMMAND};--install;${BUILD};--prefix;${prefix}"
    "${python_env};-c;import flowtrain\nassert flowtrain.stages()"
    "${CMAKE_COMMAND};-S;${SOURCE};-B;${WORK}/build;-DCMAKE_PREFIX_PATH=${prefix}"
    "${CMAKE_COMMAND};--build;${WORK}/build"
    "${WORK}/build/consumer"
    "${prefix}/bin/flowtrain;run;--plugin;${plugin};${SOURCE}/squares.yaml"
    "${prefix}/bin/flowtrain;run;build/plugin.yaml"
    "${python_env};-c;import flowtrain\nr = flowtrain.run('build/plugin.yaml')\nprint('python:', [x for s in r['phases'][0]['stages'] for x in s['results']])"
    # The build tree is a package too, before any install.
    "${CMAKE_COMMAND};-S;${SOURCE};-B;${WORK}/from-build-tree;-DCMAKE_PREFIX_PATH=${BUILD}"
    "${CMAKE_COMMAND};--build;${WORK}/from-build-tree"
    "${WORK}/from-build-tree/consumer")
  execute_process(COMMAND ${step} WORKING_DIRECTORY ${WORK}
    RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT code EQUAL 0)
    message(FATAL_ERROR "step failed (${code}): ${step}\n${out}${err}")
  endif()
  string(APPEND all "${out}")
endforeach()
foreach(expected
    "consumer ran 5 items\n(.*\n)*consumer ran 5 items"
    "results of 'sum': sum 285\n"
    "results of 'sum': sum 30\n"
    "python: \\[{'name': 'sum', 'value': 30(\\.0)?}\\]")
  if(NOT all MATCHES "${expected}")
    message(FATAL_ERROR "the output does not match '${expected}':\n${all}")
  endif()
endforeach()
message(STATUS "${all}")
