# flowtrain_warnings: an INTERFACE target every project target links for its warning flags.
add_library(flowtrain_warnings INTERFACE)
set_target_properties(flowtrain_warnings PROPERTIES EXPORT_NAME warnings)
target_compile_options(flowtrain_warnings INTERFACE
  -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wold-style-cast -Wcast-align
  -Woverloaded-virtual -Wimplicit-fallthrough
  # Options structs are meant to be filled with designated initializers, partly.
  -Wno-missing-field-initializers
  $<$<BOOL:${FLOWTRAIN_WARNINGS_AS_ERRORS}>:-Werror>)
