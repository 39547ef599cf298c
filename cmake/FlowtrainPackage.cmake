# Installs the libraries, headers and CLI, and exports flowtrain::graph, ::stages, ::data, ::train,
# ::dist and ::runner so that find_package(flowtrain) works in a user's own project, with
# flowtrain_add_plugin(NAME sources...) for a plugin of stages (cmake/FlowtrainPlugin.cmake):
# against the install prefix, or against the build tree itself (CMAKE_PREFIX_PATH=build), whose
# targets take their headers from the source tree.
include(CMakePackageConfigHelpers)
install(TARGETS flowtrain_graph flowtrain_stages flowtrain_data flowtrain_train flowtrain_dist
  flowtrain_runner
  flowtrain_opencv
  flowtrain_warnings
  EXPORT flowtrainTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/flowtrain)
install(DIRECTORY graph distributed stages runner DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/flowtrain
  FILES_MATCHING PATTERN "*.hpp"
  REGEX "graph/config(/|$)" EXCLUDE)  # config.cpp's rooms: internal, and they include yaml-cpp
install(EXPORT flowtrainTargets NAMESPACE flowtrain::
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/flowtrain)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/flowtrainConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/flowtrainConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/flowtrain)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/flowtrainConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/flowtrainConfig.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/flowtrainConfigVersion.cmake
  ${CMAKE_CURRENT_LIST_DIR}/FlowtrainPlugin.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/flowtrain)
# The build tree as a package: the same config file, beside targets that point into it.
export(EXPORT flowtrainTargets NAMESPACE flowtrain::
  FILE ${CMAKE_CURRENT_BINARY_DIR}/flowtrainTargets.cmake)
configure_file(${CMAKE_CURRENT_LIST_DIR}/FlowtrainPlugin.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/FlowtrainPlugin.cmake COPYONLY)
