#include "stages/data/decode/jpeg_crop.hpp"

// jpeglib.h needs size_t and FILE declared first.
#include <csetjmp>
#include <cstddef>
#include <cstdio>
// clang-format off
#include <jpeglib.h>
// clang-format on

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "stages/data/decode/image_decode.hpp"

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
  jpeg_compress_struct encoder{};  // index()'s re-encoding
  ErrorManager errors{};
  std::vector<JSAMPLE> last_row;      // the image's last row, read only to finish its entropy data
  std::vector<std::uint8_t> region;   // the JPEG of an indexed file's MCUs around a crop
  unsigned char* encoded = nullptr;   // jpeg_mem_dest's buffer (malloc'd by libjpeg)
  unsigned long encoded_size = 0;
  bool active = false;  // a header was read and the decode is not finished

  State() {
    cinfo.err = jpeg_std_error(&errors.base);
    errors.base.error_exit = on_error;
    errors.base.emit_message = on_message;
    errors.base.output_message = on_output;
    jpeg_create_decompress(&cinfo);
    encoder.err = &errors.base;
    jpeg_create_compress(&encoder);
  }
  ~State() {
    jpeg_destroy_compress(&encoder);
    jpeg_destroy_decompress(&cinfo);
    release_encoded();
  }

  void abort() {
    if (active) jpeg_abort_decompress(&cinfo);
    active = false;
  }
  void release_encoded() {
    std::free(encoded);
    encoded = nullptr;
    encoded_size = 0;
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

PixelRect JpegCropDecoder::scaled_crop(const AugmentParams& view,
                                       int width,
                                       int height,
                                       int min_side) {
  const PixelRect full = crop_rect(view, width, height);
  scale_denom_ = dct_scale_denom(full.width, full.height, min_side);
  const int d = scale_denom_;
  return crop_rect(view, (width + d - 1) / d, (height + d - 1) / d);  // libjpeg's rounding
}

void JpegCropDecoder::read_crop(Image& strip, PixelRect& crop) {
  jpeg_decompress_struct& cinfo = state_->cinfo;
  cinfo.scale_num = 1;
  cinfo.scale_denom = static_cast<unsigned>(scale_denom_);
  cinfo.out_color_space = JCS_RGB;  // libjpeg-turbo expands grayscale itself
  cinfo.dct_method = JDCT_ISLOW;    // as TurboJPEG without TJFLAG_FASTDCT
  cinfo.do_fancy_upsampling = TRUE;
  jpeg_start_decompress(&cinfo);
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
  crop.x -= static_cast<int>(x);
}

bool JpegCropDecoder::decode(const AugmentParams& view,
                             int min_side,
                             Image& strip,
                             PixelRect& crop,
                             ReadTo read_to) {
  State& s = *state_;
  if (!s.active) return false;
  jpeg_decompress_struct& cinfo = s.cinfo;
  crop = scaled_crop(view, width(), height(), min_side);
  if (setjmp(s.errors.jump) != 0) {
    s.abort();
    return false;
  }
  read_crop(strip, crop);
  if (read_to == ReadTo::kCropEnd) {
    s.abort();  // the rows below the crop stay unread
  } else {
    // The rows below the crop: skipped (entropy-decoded only) up to the last, which is read,
    // since skipping to the very end would mark the image finished without decoding its data.
    const int below = static_cast<int>(cinfo.output_height) - crop.y - crop.height;
    if (below > 1) jpeg_skip_scanlines(&cinfo, static_cast<JDIMENSION>(below - 1));
    if (below > 0) {
      s.last_row.resize(std::size_t{cinfo.output_width} * 3);
      JSAMPROW target = s.last_row.data();
      while (cinfo.output_scanline < cinfo.output_height) jpeg_read_scanlines(&cinfo, &target, 1);
    }
    jpeg_finish_decompress(&cinfo);  // reads up to the end marker: trailing garbage warns
    s.active = false;
  }
  crop.y = 0;
  return true;
}

namespace {

/// Re-encodes the image whose header `cinfo` has read into `encoded` (malloc'd by libjpeg): its
/// coefficients, with a restart marker after every MCU. Calls setjmp: no object with a
/// destructor in this frame.
bool transcode(jpeg_decompress_struct& cinfo,
               jpeg_compress_struct& encoder,
               ErrorManager& errors,
               unsigned char*& encoded,
               unsigned long& encoded_size,
               std::array<bool, 4>& reads_rows_across) {
  if (setjmp(errors.jump) != 0) {
    jpeg_abort_compress(&encoder);
    return false;
  }
  // Whether upsampling at each DCT scale reads a neighbouring MCU row's samples: a component
  // whose scaled blocks are not already as tall as the output's is upsampled vertically.
  // (Across columns it need not be known: jpeg_crop_scanline keeps the same MCU columns of
  // the original and of a region, and upsamples their edges alike.)
  for (int i = 0; i < 4; ++i) {
    cinfo.scale_num = 1;
    cinfo.scale_denom = 1U << i;
    jpeg_calc_output_dimensions(&cinfo);
    reads_rows_across[static_cast<std::size_t>(i)] = false;
    for (int c = 0; c < cinfo.num_components; ++c) {
      const jpeg_component_info& component = cinfo.comp_info[c];
      if (component.v_samp_factor * component.DCT_scaled_size !=
          cinfo.max_v_samp_factor * cinfo.min_DCT_scaled_size) {
        reads_rows_across[static_cast<std::size_t>(i)] = true;
      }
    }
  }
  // Back to full scale: libjpeg-turbo's entropy decoder skips the AC coefficients of components
  // whose scaled size is 1, and jpeg_read_coefficients keeps the sizes it finds.
  cinfo.scale_denom = 1;
  jpeg_calc_output_dimensions(&cinfo);
  jvirt_barray_ptr* coefficients = jpeg_read_coefficients(&cinfo);  // all of the entropy data
  jpeg_copy_critical_parameters(&cinfo, &encoder);
  encoder.restart_interval = 1;
  jpeg_mem_dest(&encoder, &encoded, &encoded_size);
  jpeg_write_coefficients(&encoder, coefficients);
  jpeg_finish_compress(&encoder);
  jpeg_finish_decompress(&cinfo);  // reads up to the end marker, as decode() does
  return true;
}

}  // namespace

std::unique_ptr<const McuIndexedJpeg> JpegCropDecoder::index() {
  State& s = *state_;
  if (!s.active) return nullptr;
  auto file = std::make_unique<McuIndexedJpeg>();
  const bool ok =
      transcode(s.cinfo, s.encoder, s.errors, s.encoded, s.encoded_size, file->reads_rows_across_);
  if (!ok) {
    s.abort();
    s.release_encoded();
    return nullptr;
  }
  s.active = false;
  const jpeg_decompress_struct& cinfo = s.cinfo;
  file->width_ = static_cast<int>(cinfo.image_width);
  file->height_ = static_cast<int>(cinfo.image_height);
  if (cinfo.num_components > 1) {  // an interleaved scan: an MCU holds each component's blocks
    file->mcu_width_ = 8 * cinfo.max_h_samp_factor;
    file->mcu_height_ = 8 * cinfo.max_v_samp_factor;
  }
  file->mcus_x_ = (file->width_ + file->mcu_width_ - 1) / file->mcu_width_;
  file->mcus_y_ = (file->height_ + file->mcu_height_ - 1) / file->mcu_height_;
  std::vector<std::uint8_t>& data = file->data_;
  data.assign(s.encoded, s.encoded + s.encoded_size);
  s.release_encoded();

  // The markers up to the scan (libjpeg writes no fill bytes), then each restart marker.
  std::size_t at = 2;
  while (at + 4 <= data.size() && data[at] == 0xFF) {
    const std::uint8_t marker = data[at + 1];
    if (marker >= 0xC0 && marker <= 0xC2) file->sof_ = at;
    at += 2 + (std::size_t{data[at + 2]} << 8 | data[at + 3]);
    if (marker == 0xDA) break;
  }
  file->scan_begin_ = at;
  file->mcu_begin_.reserve(static_cast<std::size_t>(file->mcus_x_) * file->mcus_y_);
  file->mcu_begin_.push_back(static_cast<std::uint32_t>(at));
  for (; at + 1 < data.size(); ++at) {
    if (data[at] != 0xFF || data[at + 1] == 0) continue;  // data, or a stuffed 0xFF
    if (data[at + 1] == 0xD9) {
      file->scan_end_ = at;
      break;
    }
    file->mcu_begin_.push_back(static_cast<std::uint32_t>(at + 2));  // after RSTn
    ++at;
  }
  if (file->sof_ == 0 || file->scan_end_ == 0 ||
      file->mcu_begin_.size() != static_cast<std::size_t>(file->mcus_x_) * file->mcus_y_) {
    return nullptr;  // not the layout libjpeg writes: decode the original instead
  }
  return file;
}

bool JpegCropDecoder::decode(const McuIndexedJpeg& file,
                             const AugmentParams& view,
                             int min_side,
                             Image& strip,
                             PixelRect& crop) {
  State& s = *state_;
  s.abort();
  crop = scaled_crop(view, file.width_, file.height_, min_side);
  const int d = scale_denom_;
  // The crop's MCUs at this scale, and the rows above and below where upsampling reads them.
  const int mcu_w = file.mcu_width_ / d;
  const int mcu_h = file.mcu_height_ / d;
  const int ring = file.reads_rows_across_[static_cast<std::size_t>(
                       std::countr_zero(static_cast<unsigned>(d)))]
                       ? 1
                       : 0;
  const int c0 = crop.x / mcu_w;
  const int c1 = std::min(file.mcus_x_, (crop.x + crop.width + mcu_w - 1) / mcu_w);
  const int r0 = std::max(0, crop.y / mcu_h - ring);
  const int r1 = std::min(file.mcus_y_, (crop.y + crop.height + mcu_h - 1) / mcu_h + ring);
  file.write_region(c0, c1, r0, r1, s.region);
  crop.x -= c0 * mcu_w;
  crop.y -= r0 * mcu_h;
  if (setjmp(s.errors.jump) != 0) {
    s.abort();
    return false;
  }
  s.active = true;
  jpeg_mem_src(&s.cinfo, s.region.data(), static_cast<unsigned long>(s.region.size()));
  jpeg_read_header(&s.cinfo, TRUE);
  read_crop(strip, crop);
  s.abort();  // the region's rows below the crop stay unread
  crop.y = 0;
  return true;
}

void McuIndexedJpeg::write_region(int c0, int c1, int r0, int r1,
                                  std::vector<std::uint8_t>& out) const {
  const auto begin = [&](int row, int column) {
    return std::size_t{mcu_begin_[static_cast<std::size_t>(row) * mcus_x_ + column]};
  };
  const auto end = [&](int row, int column) {  // where the MCU's data ends: its marker
    const std::size_t next = static_cast<std::size_t>(row) * mcus_x_ + column + 1;
    return next < mcu_begin_.size() ? std::size_t{mcu_begin_[next]} - 2 : scan_end_;
  };
  std::size_t size = scan_begin_;
  for (int r = r0; r < r1; ++r) size += end(r, c1 - 1) - begin(r, c0) + 2;
  out.resize(size);
  std::uint8_t* o = out.data();
  std::memcpy(o, data_.data(), scan_begin_);
  const int w = std::min(c1 * mcu_width_, width_) - c0 * mcu_width_;
  const int h = std::min(r1 * mcu_height_, height_) - r0 * mcu_height_;
  o[sof_ + 5] = static_cast<std::uint8_t>(h >> 8);
  o[sof_ + 6] = static_cast<std::uint8_t>(h);
  o[sof_ + 7] = static_cast<std::uint8_t>(w >> 8);
  o[sof_ + 8] = static_cast<std::uint8_t>(w);
  o += scan_begin_;
  unsigned restart = 0;  // the number of the next restart marker, mod 8
  for (int r = r0; r < r1; ++r) {
    // A row's MCUs are contiguous, each followed by its marker: one copy, then renumbering.
    const std::size_t first = begin(r, c0);
    const std::size_t length = end(r, c1 - 1) - first;
    std::memcpy(o, data_.data() + first, length);
    for (int c = c0; c + 1 < c1; ++c) o[end(r, c) - first + 1] = static_cast<std::uint8_t>(0xD0 + (restart++ & 7));
    o += length;
    o[0] = 0xFF;
    o[1] = static_cast<std::uint8_t>(r + 1 < r1 ? 0xD0 + (restart++ & 7) : 0xD9);
    o += 2;
  }
}

}  // namespace flowtrain::data
