# flowtrain_add_plugin(NAME source...): builds libNAME.so, a plugin of stages that
# `flowtrain run --plugin libNAME.so` or a config's `plugins:` list loads (graph/plugin.hpp).
# It links flowtrain::graph; link more of flowtrain (::stages, ::data, ::train) with
# target_link_libraries(NAME PRIVATE ...) when its stages use them. Installed with the package:
#
#   find_package(flowtrain REQUIRED)
#   flowtrain_add_plugin(mystages my_stage.cpp)
function(flowtrain_add_plugin name)
  if(NOT ARGN)
    message(FATAL_ERROR "flowtrain_add_plugin(${name}): no source files")
  endif()
  # MODULE: loaded with dlopen, never linked. Its registrars fill the registry of the program
  # that loads it, which holds the one libflowtrain.so (a shared library) they register into.
  add_library(${name} MODULE ${ARGN})
  target_link_libraries(${name} PRIVATE flowtrain::graph)
  target_compile_features(${name} PRIVATE cxx_std_20)
endfunction()
