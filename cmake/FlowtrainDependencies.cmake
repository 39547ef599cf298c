# System libraries only (Debian packages; see scripts/install-deps).
find_package(TBB REQUIRED)
find_package(yaml-cpp REQUIRED)
find_package(Threads REQUIRED)
find_package(CLI11 REQUIRED)
if(FLOWTRAIN_BUILD_TESTS AND NOT FLOWTRAIN_LIBFUZZER)
  find_package(doctest REQUIRED)
  include(doctest)  # doctest_discover_tests
endif()

# The image data path (stages/data): libjpeg-turbo, OpenCV (core, imgproc, imgcodecs) and
# LibTorch (batch tensors). Debian ships OpenCV's CMake package only with the full
# libopencv-dev (~60 more packages); the three modules we use are found directly instead.
find_package(libjpeg-turbo REQUIRED)
find_package(ZLIB REQUIRED)  # CRC-32 of LibTorch archives (stages/train/zip_check)
if(NOT FLOWTRAIN_LIBFUZZER)  # that build has no LibTorch in it
  find_package(Torch REQUIRED)
  find_package(OpenMP REQUIRED)  # per-thread intra-op counts (omp_set_num_threads)
  find_package(nlohmann_json 3 REQUIRED)  # safetensors headers (stages/train/files)
  # c10d's Gloo process group (distributed/): LibTorch's headers declare it, Gloo's headers its
  # transport (Debian's libgloo-dev). Debian's LibTorch links libgloo, and so do we; a pip torch
  # has Gloo built into libtorch_cpu, and linking another copy would give two.
  find_path(FLOWTRAIN_GLOO_INCLUDE gloo/rendezvous/store.h REQUIRED)
  get_filename_component(_torch_lib_dir "${TORCH_LIBRARY}" DIRECTORY)
  execute_process(COMMAND ${CMAKE_OBJDUMP} -p ${_torch_lib_dir}/libtorch_cpu.so
                  OUTPUT_VARIABLE _torch_cpu_headers ERROR_QUIET)
  set(FLOWTRAIN_GLOO_LIBRARY "")
  if(_torch_cpu_headers MATCHES "NEEDED +libgloo\\.so")
    find_library(GLOO_LIBRARY gloo REQUIRED)
    set(FLOWTRAIN_GLOO_LIBRARY ${GLOO_LIBRARY})
  else()
    message(STATUS "Gloo: LibTorch's own (libtorch_cpu links no libgloo), headers in ${FLOWTRAIN_GLOO_INCLUDE}")
  endif()
endif()
find_path(FLOWTRAIN_OPENCV_INCLUDE opencv2/core.hpp PATH_SUFFIXES opencv4 REQUIRED)
add_library(flowtrain_opencv INTERFACE)
target_include_directories(flowtrain_opencv SYSTEM INTERFACE ${FLOWTRAIN_OPENCV_INCLUDE})
foreach(module core imgproc)
  find_library(FLOWTRAIN_OPENCV_${module} opencv_${module} REQUIRED)
  target_link_libraries(flowtrain_opencv INTERFACE ${FLOWTRAIN_OPENCV_${module}})
endforeach()
# imgcodecs decodes the formats other than JPEG (PNG, WebP, BMP...). Debian's pulls ~140 more
# libraries (GDAL, GDCM, OpenEXR...); without it JPEGs still decode (libjpeg-turbo) and other
# formats are refused, saying so. Code and tests see FLOWTRAIN_WITH_IMGCODECS.
if(NOT FLOWTRAIN_IMAGE_CODECS MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "FLOWTRAIN_IMAGE_CODECS is '${FLOWTRAIN_IMAGE_CODECS}': use AUTO, ON or OFF")
endif()
set(FLOWTRAIN_HAVE_IMGCODECS OFF)
if(NOT FLOWTRAIN_IMAGE_CODECS STREQUAL "OFF")
  find_library(FLOWTRAIN_OPENCV_imgcodecs opencv_imgcodecs)
  if(FLOWTRAIN_OPENCV_imgcodecs AND EXISTS ${FLOWTRAIN_OPENCV_INCLUDE}/opencv2/imgcodecs.hpp)
    set(FLOWTRAIN_HAVE_IMGCODECS ON)
    target_link_libraries(flowtrain_opencv INTERFACE ${FLOWTRAIN_OPENCV_imgcodecs})
    target_compile_definitions(flowtrain_opencv INTERFACE FLOWTRAIN_WITH_IMGCODECS=1)
  elseif(FLOWTRAIN_IMAGE_CODECS STREQUAL "ON")
    message(FATAL_ERROR "FLOWTRAIN_IMAGE_CODECS is ON but OpenCV's imgcodecs is not found (libopencv-imgcodecs-dev)")
  endif()
endif()
if(NOT FLOWTRAIN_HAVE_IMGCODECS)
  message(STATUS "OpenCV imgcodecs: off (FLOWTRAIN_IMAGE_CODECS=${FLOWTRAIN_IMAGE_CODECS}): "
                 "JPEG only; other image formats are refused, and their tests are not registered")
endif()
