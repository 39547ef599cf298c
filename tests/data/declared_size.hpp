#pragma once

// Images of every format OpenCV decodes whose header declares a size other than their data's:
// a few KB that claim 16000x16000 pixels, for the max_pixels checks of the decoding stages.

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace flowtrain::testing {

/// `image` encoded as `ext` by OpenCV (`params` as for cv::imencode).
inline std::vector<std::uint8_t> opencv_encoded(const char* ext,
                                                const cv::Mat& image,
                                                const std::vector<int>& params = {}) {
  std::vector<std::uint8_t> bytes;
  REQUIRE(cv::imencode(ext, image, bytes, params));
  return bytes;
}

/// Where `text` first occurs in `bytes`.
inline std::size_t find_text(const std::vector<std::uint8_t>& bytes, std::string_view text) {
  const auto at =
      std::search(bytes.begin(), bytes.end(), text.begin(), text.end(),
                  [](std::uint8_t b, char c) { return b == static_cast<std::uint8_t>(c); });
  REQUIRE(at != bytes.end());
  return static_cast<std::size_t>(at - bytes.begin());
}

inline void put_big_endian32(std::vector<std::uint8_t>& bytes,
                             std::size_t at,
                             std::uint32_t value) {
  for (int i = 0; i < 4; ++i) bytes[at + i] = static_cast<std::uint8_t>(value >> (24 - 8 * i));
}

inline void put_little_endian32(std::vector<std::uint8_t>& bytes,
                                std::size_t at,
                                std::uint32_t value) {
  for (int i = 0; i < 4; ++i) bytes[at + i] = static_cast<std::uint8_t>(value >> (8 * i));
}

/// An image of 53x37 encoded as `format` by OpenCV, its header then changed to declare
/// `side` x `side` pixels (`side` 0: left as it is). Its data stays that of 53x37 pixels, which
/// no decoder reads as the size declared: the file is a few KB whatever it declares.
inline std::vector<std::uint8_t> declaring(std::string_view format, std::uint32_t side) {
  cv::Mat bgr(37, 53, CV_8UC3);
  cv::randu(bgr, 0, 255);
  std::vector<std::uint8_t> b;
  if (format == "PNG") {
    b = opencv_encoded(".png", bgr);
    if (side != 0) {
      put_big_endian32(b, 16, side);
      put_big_endian32(b, 20, side);
    }
  } else if (format == "BMP") {
    b = opencv_encoded(".bmp", bgr);
    if (side != 0) {
      put_little_endian32(b, 18, side);
      put_little_endian32(b, 22, side);
    }
  } else if (format == "TIFF") {  // OpenCV writes little-endian TIFF: the first directory's tags
    b = opencv_encoded(".tiff", bgr);
    const std::size_t directory = b[4] | (b[5] << 8) | (b[6] << 16) | (std::size_t{b[7]} << 24);
    for (std::size_t i = 0, n = b[directory] | (b[directory + 1] << 8); i < n && side != 0; ++i) {
      const std::size_t entry = directory + 2 + 12 * i;
      const int tag = b[entry] | (b[entry + 1] << 8);
      if (tag != 256 && tag != 257) continue;  // ImageWidth, ImageLength
      b[entry + 2] = 4;                        // as a LONG
      b[entry + 3] = 0;
      put_little_endian32(b, entry + 8, side);
    }
  } else if (format == "WebP lossless") {  // VP8L: 14 bits each of width - 1 and height - 1
    b = opencv_encoded(".webp", bgr, {cv::IMWRITE_WEBP_QUALITY, 101});
    REQUIRE(find_text(b, "VP8L") == 12);
    const std::uint32_t bits = b[21] | (b[22] << 8) | (b[23] << 16) | (std::uint32_t{b[24]} << 24);
    if (side != 0)
      put_little_endian32(b, 21, (bits & 0xF0000000u) | (side - 1) | ((side - 1) << 14));
  } else if (format == "WebP") {  // VP8: 14-bit width and height after the start code
    b = opencv_encoded(".webp", bgr, {cv::IMWRITE_WEBP_QUALITY, 90});
    REQUIRE(find_text(b, "VP8 ") == 12);
    if (side != 0) {
      for (const std::size_t at : {26, 28}) {
        b[at] = static_cast<std::uint8_t>(side);
        b[at + 1] = static_cast<std::uint8_t>((b[at + 1] & 0xC0) | (side >> 8));
      }
    }
  } else if (format == "JPEG 2000") {  // the ihdr box (height, width) and the codestream's SIZ
    b = opencv_encoded(".jp2", bgr);
    if (side != 0) {
      const std::size_t ihdr = find_text(b, "ihdr") + 4;
      put_big_endian32(b, ihdr, side);
      put_big_endian32(b, ihdr + 4, side);
      const std::size_t siz = find_text(b, "\xff\x4f\xff\x51") + 2;
      put_big_endian32(b, siz + 6, side);
      put_big_endian32(b, siz + 10, side);
    }
  } else if (format == "PNM") {
    b = opencv_encoded(".ppm", bgr);
    if (side != 0) {
      const std::string header =
          "P6\n# a comment\n" + std::to_string(side) + " " + std::to_string(side) + "\n255\n";
      b.erase(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(find_text(b, "255\n") + 4));
      b.insert(b.begin(), header.begin(), header.end());
    }
  } else if (format == "Sun raster") {
    b = opencv_encoded(".ras", bgr);
    if (side != 0) {
      put_big_endian32(b, 4, side);
      put_big_endian32(b, 8, side);
    }
  } else if (format == "HDR") {
    cv::Mat linear;
    bgr.convertTo(linear, CV_32FC3, 1.0 / 255);
    b = opencv_encoded(".hdr", linear);
    if (side != 0) {
      const std::size_t line = find_text(b, "-Y 37 +X 53");
      const std::string size = "-Y " + std::to_string(side) + " +X " + std::to_string(side);
      b.erase(b.begin() + static_cast<std::ptrdiff_t>(line),
              b.begin() + static_cast<std::ptrdiff_t>(line + 11));
      b.insert(b.begin() + static_cast<std::ptrdiff_t>(line), size.begin(), size.end());
    }
  } else if (format == "OpenEXR") {  // dataWindow: box2i {xMin, yMin, xMax, yMax}
    cv::Mat linear;
    bgr.convertTo(linear, CV_32FC3, 1.0 / 255);
    b = opencv_encoded(".exr", linear);
    const std::size_t window = find_text(b, std::string_view("dataWindow\0box2i\0", 17)) + 17 + 4;
    if (side != 0) {
      put_little_endian32(b, window + 8, side - 1);
      put_little_endian32(b, window + 12, side - 1);
    }
  } else {
    FAIL("no such format " << format);
  }
  return b;
}

}  // namespace flowtrain::testing
