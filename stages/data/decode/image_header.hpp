#pragma once

// What an encoded image's first bytes say, read without decoding it: its format, and its width
// and height. `decode_image` refuses an image above max_pixels from these, before a decoder
// allocates its pixels (a 10 KB lossless WebP may claim 16000x16000 and take 1 GB to refuse
// after decoding). Pure functions, no OpenCV or libjpeg in them.

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace flowtrain::data {

/// The format the leading bytes announce, as messages name it ("PNG", "TIFF", "WebP", ...);
/// empty if none that `decode_image` hands to OpenCV. JPEG is not among them (TurboJPEG reads
/// its header).
std::string_view sniff_format(std::span<const std::uint8_t> bytes);

struct ImageSize {
  std::int64_t width = 0;
  std::int64_t height = 0;
};

/// The width and height the header of a `format` image (a name sniff_format returns) declares:
/// PNG's IHDR, BMP's info header, TIFF's first directory (ImageWidth, ImageLength), WebP's VP8,
/// VP8L or VP8X chunk, JPEG 2000's ihdr box or SIZ marker, PNM's and PAM's text header, Radiance
/// HDR's resolution line, OpenEXR's dataWindow, Sun raster's and GIF's fixed header. These are
/// the sizes the decoders allocate for. Nothing if the header is cut short or malformed, or
/// declares a size of 0.
///   read_image_size("PNG", bytes)  // {.width = 640, .height = 360}
std::optional<ImageSize> read_image_size(std::string_view format,
                                         std::span<const std::uint8_t> bytes);

}  // namespace flowtrain::data
