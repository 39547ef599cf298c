#include "stages/data/jpeg_crop.hpp"

// jpeglib.h needs size_t and FILE declared first.
#include <csetjmp>
#include <cstddef>
#include <cstdio>
// clang-format off
#include <jpeglib.h>
// clang-format on

#include <vector>

#include "stages/data/image_decode.hpp"

namespace flowtrain::data {

namespace {

/// libjpeg reports errors through error_exit and warnings through emit_message(-1); both end
/// the decode here (a longjmp back into the call that started it), so any warning refuses the
/// image as TJFLAG_STOPONWARNING does, and decode_image then says why.
struct ErrorManager {
  jpeg_error_mgr base;
  std::jmp_buf jump;
};

[[noreturn]] void on_error(j_common_ptr cinfo) {
  std::longjmp(reinterpret_cast<ErrorManager*>(cinfo->err)->jump, 1);
}

void on_message(j_common_ptr cinfo, int level) {
  if (level < 0) on_error(cinfo);  // a warning; levels >= 0 are trace messages
}

void on_output(j_common_ptr /*cinfo*/) {}

}  // namespace

struct JpegCropDecoder::State {
  jpeg_decompress_struct cinfo{};
  ErrorManager errors{};
  std::vector<JSAMPLE> last_row;  // the image's last row, read only to finish its entropy data
  bool active = false;            // a header was read and the decode is not finished

  State() {
    cinfo.err = jpeg_std_error(&errors.base);
    errors.base.error_exit = on_error;
    errors.base.emit_message = on_message;
    errors.base.output_message = on_output;
    jpeg_create_decompress(&cinfo);
  }
  ~State() { jpeg_destroy_decompress(&cinfo); }

  void abort() {
    if (active) jpeg_abort_decompress(&cinfo);
    active = false;
  }
};

JpegCropDecoder::JpegCropDecoder() : state_(std::make_unique<State>()) {}
JpegCropDecoder::~JpegCropDecoder() = default;

int JpegCropDecoder::width() const { return static_cast<int>(state_->cinfo.image_width); }
int JpegCropDecoder::height() const { return static_cast<int>(state_->cinfo.image_height); }

// The functions below call setjmp: they keep no object with a destructor in their own frame,
// so a longjmp out of libjpeg skips nothing that needed to run.

bool JpegCropDecoder::read_header(std::span<const std::uint8_t> bytes, std::int64_t max_pixels) {
  State& s = *state_;
  s.abort();
  if (bytes.size() < 2 || bytes[0] != 0xFF || bytes[1] != 0xD8) return false;
  jpeg_decompress_struct& cinfo = s.cinfo;
  if (setjmp(s.errors.jump) != 0) {
    s.abort();
    return false;
  }
  s.active = true;
  jpeg_mem_src(&cinfo, bytes.data(), static_cast<unsigned long>(bytes.size()));
  if (jpeg_read_header(&cinfo, TRUE) != JPEG_HEADER_OK ||
      (cinfo.jpeg_color_space != JCS_YCbCr && cinfo.jpeg_color_space != JCS_GRAYSCALE &&
       cinfo.jpeg_color_space != JCS_RGB) ||
      cinfo.image_width == 0 || cinfo.image_height == 0 ||
      std::int64_t{cinfo.image_width} * cinfo.image_height > max_pixels) {
    s.abort();
    return false;
  }
  return true;
}

bool JpegCropDecoder::decode(const AugmentParams& view,
                             int min_side,
                             Image& strip,
                             PixelRect& crop,
                             ReadTo read_to) {
  State& s = *state_;
  if (!s.active) return false;
  jpeg_decompress_struct& cinfo = s.cinfo;
  const PixelRect full = crop_rect(view, width(), height());
  scale_denom_ = dct_scale_denom(full.width, full.height, min_side);
  if (setjmp(s.errors.jump) != 0) {
    s.abort();
    return false;
  }
  cinfo.scale_num = 1;
  cinfo.scale_denom = static_cast<unsigned>(scale_denom_);
  cinfo.out_color_space = JCS_RGB;  // libjpeg-turbo expands grayscale itself
  cinfo.dct_method = JDCT_ISLOW;    // as TurboJPEG without TJFLAG_FASTDCT
  cinfo.do_fancy_upsampling = TRUE;
  jpeg_start_decompress(&cinfo);

  const int out_h = static_cast<int>(cinfo.output_height);
  crop = crop_rect(view, static_cast<int>(cinfo.output_width), out_h);
  auto x = static_cast<JDIMENSION>(crop.x);
  auto w = static_cast<JDIMENSION>(crop.width);
  jpeg_crop_scanline(&cinfo, &x, &w);  // widens to whole MCU columns: x moves left, w grows

  strip.width = static_cast<int>(w);
  strip.height = crop.height;
  strip.channels = 3;
  strip.pixels.resize(std::size_t{w} * 3 * static_cast<std::size_t>(crop.height));
  if (crop.y > 0) jpeg_skip_scanlines(&cinfo, static_cast<JDIMENSION>(crop.y));
  for (int row = 0; row < crop.height;) {
    JSAMPROW target = strip.pixels.data() + std::size_t{w} * 3 * static_cast<std::size_t>(row);
    row += static_cast<int>(jpeg_read_scanlines(&cinfo, &target, 1));
  }
  if (read_to == ReadTo::kCropEnd) {
    s.abort();  // the rows below the crop stay unread
  } else {
    // The rows below the crop: skipped (entropy-decoded only) up to the last, which is read,
    // since skipping to the very end would mark the image finished without decoding its data.
    const int below = out_h - crop.y - crop.height;
    if (below > 1) jpeg_skip_scanlines(&cinfo, static_cast<JDIMENSION>(below - 1));
    if (below > 0) {
      s.last_row.resize(std::size_t{w} * 3);
      JSAMPROW target = s.last_row.data();
      while (cinfo.output_scanline < cinfo.output_height) jpeg_read_scanlines(&cinfo, &target, 1);
    }
    jpeg_finish_decompress(&cinfo);  // reads up to the end marker: trailing garbage warns
    s.active = false;
  }
  crop.x -= static_cast<int>(x);
  crop.y = 0;
  return true;
}

}  // namespace flowtrain::data
