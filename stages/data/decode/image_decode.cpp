#include "stages/data/decode/image_decode.hpp"

#include <turbojpeg.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <opencv2/core.hpp>
#ifdef FLOWTRAIN_WITH_IMGCODECS
#include <opencv2/imgcodecs.hpp>
#endif
#include <opencv2/imgproc.hpp>
#include <optional>
#include <streambuf>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "graph/error.hpp"
#include "stages/data/decode/image_header.hpp"

namespace flowtrain::data {
namespace {

/// Refuses progressive JPEGs with an absurd number of scans (a known decoding-time attack).
constexpr int kDecodeFlags = TJFLAG_LIMITSCANS;
constexpr std::string_view kJpegEof = "Premature end of JPEG file";

/// A TurboJPEG decompressor, one per thread.
class Decompressor {
 public:
  Decompressor() = default;
  Decompressor(const Decompressor&) = delete;
  Decompressor& operator=(const Decompressor&) = delete;
  ~Decompressor() { reset(); }

  tjhandle get() {
    if (handle_ == nullptr) {
      handle_ = tjInitDecompress();
      if (handle_ == nullptr) {
        throw Error(std::string("cannot create a TurboJPEG decompressor: ") +
                    tjGetErrorStr2(nullptr));
      }
    }
    return handle_;
  }

  // libjpeg-turbo 2.1 can leave a handle unusable after a failed decode (a JPEG cut inside a
  // Huffman table makes every later header read on that handle fail with "Bogus Huffman table
  // definition"), so a handle that saw an error or a warning is replaced, never reused.
  void reset() {
    if (handle_ != nullptr) tjDestroy(handle_);
    handle_ = nullptr;
  }

 private:
  tjhandle handle_ = nullptr;
};

/// Per-thread state, so decoding takes no lock and reuses its buffers from sample to sample.
/// The vectors' sizes only grow (a high-water mark) so that reuse does not zero them again.
struct ThreadScratch {
  Decompressor decompressor;
  std::vector<std::uint8_t> file;  // the bytes of a file read from Sample::path
  std::vector<std::uint8_t> cmyk;  // CMYK pixels before their conversion to RGB

  void trim() {
    for (std::vector<std::uint8_t>* buffer : {&file, &cmyk}) {
      if (buffer->capacity() > kKeepScratchBytes) std::vector<std::uint8_t>().swap(*buffer);
    }
  }
};

ThreadScratch& thread_scratch() {
  thread_local ThreadScratch scratch;
  return scratch;
}

void ensure_size(std::vector<std::uint8_t>& buffer, std::size_t size) {
  if (buffer.size() < size) buffer.resize(size);
}

/// A dimension scaled by 1/denom, rounded up as libjpeg does (TJSCALED).
int scaled(int dim, int denom) { return (dim + denom - 1) / denom; }

/// The reductions libjpeg-turbo offers among 1/8, 1/4 and 1/2, strongest first.
const std::vector<int>& reduction_denoms() {
  static const std::vector<int> denoms = [] {
    int count = 0;
    const tjscalingfactor* factors = tjGetScalingFactors(&count);
    std::vector<int> found;
    for (const int denom : {8, 4, 2}) {
      for (int i = 0; factors != nullptr && i < count; ++i) {
        if (factors[i].num == 1 && factors[i].denom == denom) found.push_back(denom);
      }
    }
    return found;
  }();
  return denoms;
}

std::string too_large(std::int64_t width, std::int64_t height, std::int64_t max_pixels) {
  return "image " + std::to_string(width) + "x" + std::to_string(height) + " exceeds max_pixels " +
         std::to_string(max_pixels);
}

bool starts_with(std::span<const std::uint8_t> bytes, std::size_t offset, std::string_view magic) {
  return bytes.size() >= offset + magic.size() &&
         std::memcmp(bytes.data() + offset, magic.data(), magic.size()) == 0;
}

// ---- JPEG ---------------------------------------------------------------------------------------

bool ends_with_eoi(std::span<const std::uint8_t> bytes) {
  return bytes.size() >= 2 && bytes[bytes.size() - 2] == 0xFF && bytes.back() == 0xD9;
}

/// The libjpeg message for a refused JPEG, without libjpeg's own "Corrupt JPEG data: " prefix.
std::string corrupt(std::string_view message) {
  constexpr std::string_view kPrefix = "Corrupt JPEG data: ";
  if (message.starts_with(kPrefix)) message.remove_prefix(kPrefix.size());
  return "corrupt JPEG data: " + std::string(message);
}

/// Why tjDecompressHeader3 found no image: `rc` is its result (0 when it returned no size).
std::string header_failure(tjhandle handle, int rc, std::span<const std::uint8_t> bytes) {
  const bool warned = tjGetErrorCode(handle) == TJERR_WARNING;
  if (rc == 0) {
    // libjpeg met an end of image before any frame header: either the one it fakes when the data
    // runs out (with a warning), or a real one in a tables-only stream.
    return warned ? "truncated JPEG data" : "corrupt JPEG data: no image, only tables";
  }
  const std::string_view message = tjGetErrorStr2(handle);
  // Without a stop-on-warning flag for headers, a fatal error replaces the message of the warning
  // before it. When the data also lacks its end marker, that warning was libjpeg running out of
  // data, and the error only what it ran into next.
  if (message == kJpegEof || (warned && !ends_with_eoi(bytes))) return "truncated JPEG data";
  return corrupt(message);
}

/// Warnings about header fields libjpeg ignores before it reads any pixel data.
bool benign_warning(tjhandle handle) {
  if (tjGetErrorCode(handle) != TJERR_WARNING) return false;
  const std::string_view message = tjGetErrorStr2(handle);
  return message.starts_with("Warning: unknown JFIF revision number") ||
         message == "Invalid SOS parameters for sequential JPEG";
}

std::string decode_failure(tjhandle handle) {
  const std::string_view message = tjGetErrorStr2(handle);
  if (message == kJpegEof) return "truncated JPEG data";
  return corrupt(message);
}

/// Decompresses into `target` (w x h pixels of `format`); returns why not, or an empty string.
std::string decompress(Decompressor& decompressor,
                       std::span<const std::uint8_t> bytes,
                       std::uint8_t* target,
                       int width,
                       int height,
                       int format) {
  // Stop at the first warning: a corrupt scan is then not decoded to its end, and the message
  // says what went wrong first (later errors would replace it).
  tjhandle handle = decompressor.get();
  if (tjDecompress2(handle, bytes.data(), bytes.size(), target, width, 0, height, format,
                    kDecodeFlags | TJFLAG_STOPONWARNING) == 0) {
    return {};
  }
  if (!benign_warning(handle)) {
    std::string error = decode_failure(handle);
    decompressor.reset();
    return error;
  }
  // A warning about a header field only: decode again, this time to the end.
  decompressor.reset();
  handle = decompressor.get();
  const int rc = tjDecompress2(handle, bytes.data(), bytes.size(), target, width, 0, height, format,
                               kDecodeFlags);
  std::string error = rc == 0 || benign_warning(handle) ? std::string() : decode_failure(handle);
  decompressor.reset();
  return error;
}

/// Whether the JPEG header has an Adobe APP14 segment: its CMYK is then stored inverted
/// (0 = full ink), as Photoshop writes it.
bool has_adobe_marker(std::span<const std::uint8_t> bytes) {
  std::size_t pos = 2;  // after SOI
  while (pos + 4 <= bytes.size() && bytes[pos] == 0xFF) {
    const std::uint8_t marker = bytes[pos + 1];
    if (marker == 0xFF) {  // fill byte
      ++pos;
      continue;
    }
    if (marker == 0xDA || marker == 0xD9) return false;  // SOS or EOI: the header is over
    const std::size_t length = (std::size_t{bytes[pos + 2]} << 8) | bytes[pos + 3];
    if (marker == 0xEE && length >= 7 && starts_with(bytes, pos + 4, "Adobe")) return true;
    pos += 2 + length;
  }
  return false;
}

void cmyk_to_rgb(const std::uint8_t* cmyk, std::size_t pixels, bool inverted, std::uint8_t* rgb) {
  // With inverted storage c' = 255 - C and k' = 255 - K, so R = 255 (1 - C)(1 - K) = c' k' / 255.
  const unsigned flip = inverted ? 0 : 255;
  for (std::size_t i = 0; i < pixels; ++i, cmyk += 4, rgb += 3) {
    const unsigned k = cmyk[3] ^ flip;
    rgb[0] = static_cast<std::uint8_t>(((cmyk[0] ^ flip) * k + 127) / 255);
    rgb[1] = static_cast<std::uint8_t>(((cmyk[1] ^ flip) * k + 127) / 255);
    rgb[2] = static_cast<std::uint8_t>(((cmyk[2] ^ flip) * k + 127) / 255);
  }
}

DecodeResult decode_jpeg(std::span<const std::uint8_t> bytes,
                         const DecodeOptions& options,
                         Image& out) {
  ThreadScratch& scratch = thread_scratch();
  tjhandle handle = scratch.decompressor.get();
  int width = 0;
  int height = 0;
  int subsampling = 0;
  int colorspace = 0;
  // libjpeg-turbo 2.1 returns -1 on a warning too (with the size set), and 0 without setting
  // the size when the data ends before a frame header.
  const int rc = tjDecompressHeader3(handle, bytes.data(), bytes.size(), &width, &height,
                                     &subsampling, &colorspace);
  if ((rc != 0 && !benign_warning(handle)) || width <= 0 || height <= 0) {
    DecodeResult failed{header_failure(handle, rc, bytes)};
    scratch.decompressor.reset();
    return failed;
  }
  if (std::int64_t{width} * height > options.max_pixels) {
    scratch.decompressor.reset();
    return {too_large(width, height, options.max_pixels)};
  }

  DecodeResult result;
  result.scale_denom = dct_scale_denom(width, height, options.min_side);
  const int w = scaled(width, result.scale_denom);
  const int h = scaled(height, result.scale_denom);
  const std::size_t pixels = static_cast<std::size_t>(w) * static_cast<std::size_t>(h);
  // libjpeg converts grayscale to RGB itself, but not CMYK: that goes through a scratch buffer.
  const bool cmyk = colorspace == TJCS_CMYK || colorspace == TJCS_YCCK;
  out.pixels.resize(pixels * 3);
  std::uint8_t* target = out.pixels.data();
  if (cmyk) {
    ensure_size(scratch.cmyk, pixels * 4);
    target = scratch.cmyk.data();
  }
  result.error = decompress(scratch.decompressor, bytes, target, w, h, cmyk ? TJPF_CMYK : TJPF_RGB);
  if (!result.ok()) return result;
  if (cmyk) cmyk_to_rgb(scratch.cmyk.data(), pixels, has_adobe_marker(bytes), out.pixels.data());
  out.width = w;
  out.height = h;
  out.channels = 3;
  return result;
}

// ---- other formats, through OpenCV --------------------------------------------------------------

/// Whether this thread is inside cv::imdecode (its lines on std::cerr are then dropped).
thread_local bool t_in_imdecode = false;

/// std::cerr's buffer once quiet_opencv_decode_errors() ran: passes every write on to the
/// buffer it replaced, except a thread's writes while it is inside cv::imdecode.
class QuietInImdecode final : public std::streambuf {
 public:
  explicit QuietInImdecode(std::streambuf* target) : target_(target) {}

 protected:
  int_type overflow(int_type c) override {
    if (t_in_imdecode || traits_type::eq_int_type(c, traits_type::eof())) {
      return traits_type::not_eof(c);
    }
    return target_->sputc(traits_type::to_char_type(c));
  }
  std::streamsize xsputn(const char* text, std::streamsize n) override {
    return t_in_imdecode ? n : target_->sputn(text, n);
  }
  int sync() override { return t_in_imdecode ? 0 : target_->pubsync(); }

 private:
  std::streambuf* target_;
};

#ifdef FLOWTRAIN_WITH_IMGCODECS
cv::Mat quiet_imdecode(const cv::Mat& encoded, int flags) {
  quiet_opencv_decode_errors();
  t_in_imdecode = true;
  struct Unmute {
    ~Unmute() { t_in_imdecode = false; }
  } unmute;
  return cv::imdecode(encoded, flags);
}
#endif

DecodeResult decode_other(std::span<const std::uint8_t> bytes,
                          const DecodeOptions& options,
                          Image& out) {
  const std::string format(sniff_format(bytes));
  // Only the formats sniffed above go to OpenCV: it tries every decoder it has on anything else,
  // and some abort the process on damaged data (found by libFuzzer: GDCM, OpenCV's DICOM
  // reader, fails an assert on a 135-byte file).
  if (format.empty()) return {"not an image (unknown format)"};
  if (!options.other_formats) return {"not a JPEG (" + format + " data) and other_formats is false"};
#ifndef FLOWTRAIN_WITH_IMGCODECS
  (void)out;
  return {"cannot decode " + format + " data: this build has no OpenCV image codecs (JPEG only)"};
#else
  // The size from the header, before a decoder allocates for it (a lossless WebP of 10 KB may
  // declare 16000x16000 pixels). A header that declares none is refused: the decoder would
  // refuse it too, or find a size we did not check.
  const std::optional<ImageSize> size = read_image_size(format, bytes);
  if (!size) return {"cannot decode " + format + " data (no image size in its header)"};
  // width * height > max_pixels, without the product (two 32-bit fields overflow 64 bits)
  if (size->width > options.max_pixels / size->height) {
    return {too_large(size->width, size->height, options.max_pixels)};
  }
  if (bytes.size() > static_cast<std::size_t>(INT_MAX)) {
    return {"file of " + std::to_string(bytes.size()) + " bytes is too large for OpenCV"};
  }
  cv::Mat decoded;
  try {
    // A header over the bytes: OpenCV reads them in place.
    const cv::Mat encoded(1, static_cast<int>(bytes.size()), CV_8UC1,
                          const_cast<std::uint8_t*>(bytes.data()));
    decoded = quiet_imdecode(encoded, cv::IMREAD_COLOR | cv::IMREAD_IGNORE_ORIENTATION);
  } catch (const cv::Exception& e) {
    return {"cannot decode " + format + " data: " + e.err};
  }
  if (decoded.empty()) return {"cannot decode " + format + " data (corrupt or unsupported)"};
  if (static_cast<std::int64_t>(decoded.total()) > options.max_pixels) {
    return {too_large(decoded.cols, decoded.rows, options.max_pixels)};
  }
  // IMREAD_COLOR yields 8-bit BGR (gray expanded, alpha dropped); convert straight into `out`.
  out.pixels.resize(decoded.total() * 3);
  cv::Mat rgb(decoded.rows, decoded.cols, CV_8UC3, out.pixels.data());
  const int code = decoded.channels() == 1   ? cv::COLOR_GRAY2RGB
                   : decoded.channels() == 4 ? cv::COLOR_BGRA2RGB
                                             : cv::COLOR_BGR2RGB;
  if (decoded.depth() != CV_8U) decoded.convertTo(decoded, CV_8U);
  cv::cvtColor(decoded, rgb, code);
  out.width = decoded.cols;
  out.height = decoded.rows;
  out.channels = 3;
  return {};
#endif
}

DecodeResult decode_any(std::span<const std::uint8_t> bytes,
                        const DecodeOptions& options,
                        Image& out) {
  if (bytes.empty()) return {"empty file"};
  if (bytes.size() >= 2 && bytes[0] == 0xFF && bytes[1] == 0xD8) {
    return decode_jpeg(bytes, options, out);
  }
  return decode_other(bytes, options, out);
}

}  // namespace

void quiet_opencv_decode_errors() {
  static const bool installed = [] {
    // Never deleted: std::cerr may be written to until the process ends.
    std::cerr.rdbuf(new QuietInImdecode(std::cerr.rdbuf()));
    return true;
  }();
  (void)installed;
}

int dct_scale_denom(int width, int height, int min_side) {
  if (min_side <= 0) return 1;
  for (const int denom : reduction_denoms()) {
    if (std::min(scaled(width, denom), scaled(height, denom)) >= min_side) return denom;
  }
  return 1;
}

DecodeResult decode_image(std::span<const std::uint8_t> bytes,
                          const DecodeOptions& options,
                          Image& out) {
  DecodeResult result = decode_any(bytes, options, out);
  if (!result.ok()) {
    out.width = out.height = out.channels = 0;
    out.pixels.clear();
  }
  return result;
}

std::string sample_bytes(const Sample& sample,
                         std::span<const std::uint8_t>& bytes,
                         std::int64_t max_file_bytes) {
  bytes = sample.encoded.bytes;
  if (!bytes.empty()) return {};
  if (sample.path.empty()) return "no encoded bytes and no path to read";
  if (std::string error = read_file(sample.path, thread_scratch().file, bytes, max_file_bytes);
      !error.empty()) {
    return "cannot read file: " + error;
  }
  return {};
}

void release_encoded(Sample& sample) {
  sample.encoded.reset();
  thread_scratch().trim();
}

}  // namespace flowtrain::data
