#include "stages/data/decode/image_header.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <string_view>

namespace flowtrain::data {
namespace {

using Bytes = std::span<const std::uint8_t>;

bool starts_with(Bytes bytes, std::size_t offset, std::string_view magic) {
  return bytes.size() >= offset + magic.size() &&
         std::memcmp(bytes.data() + offset, magic.data(), magic.size()) == 0;
}

/// Whether `bytes` has `n` bytes from `at` (without overflowing at + n).
bool has(Bytes bytes, std::uint64_t at, std::uint64_t n) {
  return at <= bytes.size() && n <= bytes.size() - at;
}

std::uint32_t big_endian16(const std::uint8_t* p) { return (std::uint32_t{p[0]} << 8) | p[1]; }

std::uint32_t little_endian16(const std::uint8_t* p) { return (std::uint32_t{p[1]} << 8) | p[0]; }

std::uint32_t little_endian24(const std::uint8_t* p) {
  return (std::uint32_t{p[2]} << 16) | (std::uint32_t{p[1]} << 8) | p[0];
}

std::uint32_t big_endian32(const std::uint8_t* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) |
         p[3];
}

std::uint32_t little_endian32(const std::uint8_t* p) {
  return (std::uint32_t{p[3]} << 24) | (std::uint32_t{p[2]} << 16) | (std::uint32_t{p[1]} << 8) |
         p[0];
}

std::optional<ImageSize> positive(std::int64_t width, std::int64_t height) {
  if (width <= 0 || height <= 0) return std::nullopt;
  return ImageSize{width, height};
}

std::optional<ImageSize> png_size(Bytes bytes) {
  // The signature, then the IHDR chunk's length and type, then width and height.
  if (!has(bytes, 0, 24) || !starts_with(bytes, 12, "IHDR")) return std::nullopt;
  return positive(big_endian32(&bytes[16]), big_endian32(&bytes[20]));
}

std::optional<ImageSize> bmp_size(Bytes bytes) {
  if (!has(bytes, 0, 26)) return std::nullopt;
  const std::uint32_t header = little_endian32(&bytes[14]);
  if (header == 12) {  // OS/2 BITMAPCOREHEADER: 16-bit width and height
    return positive(little_endian16(&bytes[18]), little_endian16(&bytes[20]));
  }
  if (header < 40) return std::nullopt;
  // BITMAPINFOHEADER or later: int32 width, then height (negative for top-down rows).
  const auto width = static_cast<std::int32_t>(little_endian32(&bytes[18]));
  const auto height = static_cast<std::int32_t>(little_endian32(&bytes[22]));
  return positive(std::abs(std::int64_t{width}), std::abs(std::int64_t{height}));
}

std::optional<ImageSize> tiff_size(Bytes bytes) {
  if (!has(bytes, 0, 8)) return std::nullopt;
  const bool little = bytes[0] == 'I';
  const auto u16 = [&](std::uint64_t at) {
    return little ? little_endian16(&bytes[at]) : big_endian16(&bytes[at]);
  };
  const auto u32 = [&](std::uint64_t at) {
    return little ? little_endian32(&bytes[at]) : big_endian32(&bytes[at]);
  };
  // The first directory (the page OpenCV decodes): 12-byte entries {tag, type, count, value}.
  const std::uint64_t directory = u32(4);
  if (!has(bytes, directory, 2)) return std::nullopt;
  const std::uint32_t entries = u16(directory);
  std::int64_t width = 0;
  std::int64_t height = 0;
  for (std::uint32_t i = 0; i < entries; ++i) {
    const std::uint64_t at = directory + 2 + std::uint64_t{12} * i;
    if (!has(bytes, at, 12)) return std::nullopt;
    const std::uint32_t tag = u16(at);
    if (tag != 256 && tag != 257) continue;  // ImageWidth, ImageLength
    const std::uint32_t type = u16(at + 2);
    if (u32(at + 4) != 1 || (type != 3 && type != 4)) return std::nullopt;  // one SHORT or LONG
    const std::int64_t value = type == 3 ? u16(at + 8) : u32(at + 8);
    std::int64_t& field = tag == 256 ? width : height;
    if (field == 0) field = value;  // libtiff keeps the first of duplicated tags
  }
  return positive(width, height);
}

std::optional<ImageSize> webp_size(Bytes bytes) {
  // "RIFF", size, "WEBP", then the first chunk: its type, its size, its payload at 20.
  if (starts_with(bytes, 12, "VP8X") && has(bytes, 0, 30)) {  // extended: the canvas size
    return positive(std::int64_t{little_endian24(&bytes[24])} + 1,
                    std::int64_t{little_endian24(&bytes[27])} + 1);
  }
  if (starts_with(bytes, 12, "VP8L") && has(bytes, 0, 25) && bytes[20] == 0x2f) {  // lossless
    const std::uint32_t bits = little_endian32(&bytes[21]);
    return positive((bits & 0x3fff) + 1, ((bits >> 14) & 0x3fff) + 1);
  }
  if (starts_with(bytes, 12, "VP8 ") && has(bytes, 0, 30) &&
      starts_with(bytes, 23, "\x9d\x01\x2a")) {  // lossy: a key frame's start code, then sizes
    return positive(little_endian16(&bytes[26]) & 0x3fff, little_endian16(&bytes[28]) & 0x3fff);
  }
  return std::nullopt;
}

/// A JPEG 2000 codestream's image size, from its SIZ marker segment (right after SOC).
std::optional<ImageSize> codestream_size(Bytes bytes) {
  if (!has(bytes, 0, 24) || !starts_with(bytes, 0, "\xff\x4f\xff\x51")) return std::nullopt;
  // Lsiz, Rsiz, then Xsiz, Ysiz (the grid's far corner) and XOsiz, YOsiz (the image's origin).
  const std::int64_t xsiz = big_endian32(&bytes[8]);
  const std::int64_t ysiz = big_endian32(&bytes[12]);
  return positive(xsiz - big_endian32(&bytes[16]), ysiz - big_endian32(&bytes[20]));
}

/// A JP2 file: a sequence of boxes. The size is the codestream's (what OpenJPEG allocates for),
/// or the ihdr box's where that is larger.
std::optional<ImageSize> jp2_size(Bytes bytes) {
  std::optional<ImageSize> codestream;
  std::optional<ImageSize> ihdr;
  // Boxes at the top level, and in the header box (jp2h) only: no deeper nesting to follow.
  const auto walk = [&](auto& self, Bytes boxes, bool top) -> bool {
    std::uint64_t at = 0;
    while (has(boxes, at, 8)) {
      std::uint64_t length = big_endian32(&boxes[at]);
      std::uint64_t header = 8;
      if (length == 1) {  // a 64-bit length follows the type
        if (!has(boxes, at, 16)) return false;
        length =
            (std::uint64_t{big_endian32(&boxes[at + 8])} << 32) | big_endian32(&boxes[at + 12]);
        header = 16;
      } else if (length == 0) {  // the last box, to the end
        length = boxes.size() - at;
      }
      if (length < header || !has(boxes, at, length)) return false;
      const Bytes content = boxes.subspan(at + header, length - header);
      if (top && starts_with(boxes, at + 4, "jp2h") && !self(self, content, false)) return false;
      if (starts_with(boxes, at + 4, "ihdr") && has(content, 0, 8) && !ihdr) {
        ihdr = positive(big_endian32(&content[4]), big_endian32(&content[0]));  // height first
      }
      if (starts_with(boxes, at + 4, "jp2c") && !codestream) codestream = codestream_size(content);
      at += length;
    }
    return true;
  };
  if (!walk(walk, bytes, true) || !codestream) return std::nullopt;
  if (ihdr) {
    codestream->width = std::max(codestream->width, ihdr->width);
    codestream->height = std::max(codestream->height, ihdr->height);
  }
  return codestream;
}

/// Reads the ASCII header tokens of PNM (P1-P6: width, height) and PAM (P7: WIDTH n, HEIGHT n,
/// ..., ENDHDR), skipping whitespace and '#' comments.
class TextTokens {
 public:
  TextTokens(Bytes bytes, std::size_t at) : bytes_(bytes), at_(at) {}

  std::string_view next() {
    while (at_ < bytes_.size()) {
      if (bytes_[at_] == '#') {
        while (at_ < bytes_.size() && bytes_[at_] != '\n') ++at_;
      } else if (std::isspace(bytes_[at_]) != 0) {
        ++at_;
      } else {
        break;
      }
    }
    const std::size_t begin = at_;
    while (at_ < bytes_.size() && std::isspace(bytes_[at_]) == 0 && bytes_[at_] != '#') ++at_;
    return {reinterpret_cast<const char*>(bytes_.data()) + begin, at_ - begin};
  }

 private:
  Bytes bytes_;
  std::size_t at_;
};

/// A decimal number of at most 18 digits (no sign), or -1.
std::int64_t number(std::string_view text) {
  if (text.empty() || text.size() > 18) return -1;
  std::int64_t value = 0;
  for (const char c : text) {
    if (c < '0' || c > '9') return -1;
    value = value * 10 + (c - '0');
  }
  return value;
}

std::optional<ImageSize> pnm_size(Bytes bytes) {
  TextTokens tokens(bytes, 2);
  if (bytes[1] != '7') {
    const std::int64_t width = number(tokens.next());
    return positive(width, number(tokens.next()));
  }
  std::int64_t width = 0;
  std::int64_t height = 0;
  for (int i = 0; i < 64; ++i) {  // a PAM header has a handful of fields
    const std::string_view token = tokens.next();
    if (token.empty() || token == "ENDHDR") break;
    if (token == "WIDTH") width = number(tokens.next());
    if (token == "HEIGHT") height = number(tokens.next());
  }
  return positive(width, height);
}

/// Radiance HDR: text lines up to an empty one, then the resolution ("-Y 360 +X 640").
std::optional<ImageSize> hdr_size(Bytes bytes) {
  const std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  std::size_t blank = text.find("\n\n");
  std::size_t skip = 2;
  if (const std::size_t crlf = text.find("\n\r\n"); crlf < blank) {
    blank = crlf;
    skip = 3;
  }
  if (blank == std::string_view::npos) return std::nullopt;
  const std::size_t begin = blank + skip;
  const std::string_view line = text.substr(begin, text.find('\n', begin) - begin);
  TextTokens tokens({bytes.data() + begin, line.size()}, 0);
  std::int64_t width = 0;
  std::int64_t height = 0;
  for (int i = 0; i < 2; ++i) {
    const std::string_view axis = tokens.next();
    const std::int64_t value = number(tokens.next());
    if (axis == "-Y" || axis == "+Y") {
      height = value;
    } else if (axis == "-X" || axis == "+X") {
      width = value;
    } else {
      return std::nullopt;
    }
  }
  return positive(width, height);
}

/// OpenEXR: after the magic and version, attributes {name NUL, type NUL, int32 size, value} up
/// to an empty name; the data window is a box2i {xMin, yMin, xMax, yMax}.
std::optional<ImageSize> exr_size(Bytes bytes) {
  std::size_t at = 8;
  while (at < bytes.size() && bytes[at] != 0) {
    const auto text = [&](std::size_t from) {
      const void* end = std::memchr(bytes.data() + from, 0, bytes.size() - from);
      return end == nullptr
                 ? std::string_view()
                 : std::string_view(reinterpret_cast<const char*>(bytes.data()) + from,
                                    static_cast<const std::uint8_t*>(end) - (bytes.data() + from));
    };
    const std::string_view name = text(at);
    if (name.empty()) return std::nullopt;
    const std::size_t type_at = at + name.size() + 1;
    if (type_at >= bytes.size()) return std::nullopt;
    const std::string_view type = text(type_at);
    if (type.empty()) return std::nullopt;
    const std::size_t size_at = type_at + type.size() + 1;
    if (!has(bytes, size_at, 4)) return std::nullopt;
    const std::uint32_t size = little_endian32(&bytes[size_at]);
    const std::size_t value = size_at + 4;
    if (!has(bytes, value, size)) return std::nullopt;
    if (name == "dataWindow" && type == "box2i" && size == 16) {
      const auto corner = [&](std::size_t i) {
        return std::int64_t{static_cast<std::int32_t>(little_endian32(&bytes[value + 4 * i]))};
      };
      return positive(corner(2) - corner(0) + 1, corner(3) - corner(1) + 1);
    }
    at = value + size;
  }
  return std::nullopt;
}

}  // namespace

std::string_view sniff_format(std::span<const std::uint8_t> bytes) {
  if (starts_with(bytes, 0, "\x89PNG\r\n\x1a\n")) return "PNG";
  if (starts_with(bytes, 0, "BM")) return "BMP";
  if (starts_with(bytes, 0, "GIF87a") || starts_with(bytes, 0, "GIF89a")) return "GIF";
  if (starts_with(bytes, 0, std::string_view("II*\0", 4)) ||
      starts_with(bytes, 0, std::string_view("MM\0*", 4))) {
    return "TIFF";
  }
  if (starts_with(bytes, 0, "RIFF") && starts_with(bytes, 8, "WEBP")) return "WebP";
  if (starts_with(bytes, 0, std::string_view("\0\0\0\x0cjP  ", 8)) ||
      starts_with(bytes, 0, "\xff\x4f\xff\x51")) {
    return "JPEG 2000";
  }
  if (bytes.size() >= 3 && bytes[0] == 'P' && bytes[1] >= '1' && bytes[1] <= '7' &&
      std::strchr(" \t\r\n", bytes[2]) != nullptr) {
    return "PNM";
  }
  if (starts_with(bytes, 0, "#?RADIANCE") || starts_with(bytes, 0, "#?RGBE")) return "HDR";
  if (starts_with(bytes, 0, "\x76\x2f\x31\x01")) return "OpenEXR";
  if (starts_with(bytes, 0, "\x59\xa6\x6a\x95")) return "Sun raster";
  return {};
}

std::optional<ImageSize> read_image_size(std::string_view format,
                                         std::span<const std::uint8_t> bytes) {
  if (format == "PNG") return png_size(bytes);
  if (format == "BMP") return bmp_size(bytes);
  if (format == "TIFF") return tiff_size(bytes);
  if (format == "WebP") return webp_size(bytes);
  if (format == "JPEG 2000") {
    return starts_with(bytes, 0, "\xff\x4f") ? codestream_size(bytes) : jp2_size(bytes);
  }
  if (format == "PNM" && bytes.size() >= 2) return pnm_size(bytes);
  if (format == "HDR") return hdr_size(bytes);
  if (format == "OpenEXR") return exr_size(bytes);
  if (format == "Sun raster" && has(bytes, 0, 12)) {
    return positive(big_endian32(&bytes[4]), big_endian32(&bytes[8]));
  }
  if (format == "GIF" && has(bytes, 0, 10)) {  // the logical screen
    return positive(little_endian16(&bytes[6]), little_endian16(&bytes[8]));
  }
  return std::nullopt;
}

}  // namespace flowtrain::data
