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
  # c10d's Gloo process group (distributed/): LibTorch's headers declare it, libgloo implements
  # the transport (Debian's libgloo-dev).
  find_library(GLOO_LIBRARY gloo REQUIRED)
endif()
find_path(FLOWTRAIN_OPENCV_INCLUDE opencv2/core.hpp PATH_SUFFIXES opencv4 REQUIRED)
add_library(flowtrain_opencv INTERFACE)
target_include_directories(flowtrain_opencv SYSTEM INTERFACE ${FLOWTRAIN_OPENCV_INCLUDE})
foreach(module core imgproc imgcodecs)
  find_library(FLOWTRAIN_OPENCV_${module} opencv_${module} REQUIRED)
  target_link_libraries(flowtrain_opencv INTERFACE ${FLOWTRAIN_OPENCV_${module}})
endforeach()
