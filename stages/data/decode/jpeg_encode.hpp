#pragma once

#include <cstdint>
#include <vector>

namespace flowtrain::data {

/// Encodes `height` rows of `width` pixels (rows `pitch` bytes apart; 0: packed) as a baseline
/// JPEG with TurboJPEG: `pixel_format` a TJPF_* (TJPF_RGB, TJPF_BGR, TJPF_GRAY, TJPF_CMYK),
/// `subsampling` a TJSAMP_*, `flags` TJFLAG_*s. Throws flowtrain::Error saying why it failed.
/// With TJFLAG_ACCURATEDCT its bytes equal OpenCV 4.6's cv::imencode(".jpg", ...) at the same
/// quality (4:2:0 for colour, TJSAMP_GRAY for one channel), so it replaces imencode where a build
/// has no OpenCV imgcodecs without changing a file.
///   auto bytes = compress_jpeg(bgr.data, w, h, 0, TJPF_BGR, TJSAMP_420, 90, TJFLAG_ACCURATEDCT);
std::vector<std::uint8_t> compress_jpeg(const std::uint8_t* pixels,
                                        int width,
                                        int height,
                                        int pitch,
                                        int pixel_format,
                                        int subsampling,
                                        int quality,
                                        int flags);

}  // namespace flowtrain::data
