#pragma once

#include <opencv2/core/utility.hpp>

namespace flowtrain::data {

/// OpenCV parallelises some kernels (resize, colour conversion) on a thread pool of its own,
/// which would compete with the TBB workers for cores the config did not grant it. flowtrain
/// budgets cores per stage, so OpenCV runs on the calling stage thread. Process-wide, once.
inline void keep_opencv_on_caller_thread() {
  static const bool done = [] {
    cv::setNumThreads(0);
    return true;
  }();
  (void)done;
}

}  // namespace flowtrain::data
