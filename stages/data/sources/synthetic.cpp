#include "stages/data/sources/synthetic.hpp"

#include <turbojpeg.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <numbers>
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>
#include <system_error>

#include "graph/atomic_file.hpp"
#include "graph/error.hpp"
#include "stages/data/decode/image_decode.hpp"
#include "stages/data/decode/jpeg_encode.hpp"

namespace flowtrain::data {
namespace {

namespace fs = std::filesystem;

/// The dimensions a kHugeDimensions file claims: 3.6e9 pixels, above any sane max_pixels.
constexpr int kHugeSide = 60000;

/// splitmix64: small, fast and the same on every platform (std distributions are not).
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  /// Uniform in [0, 1).
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

 private:
  std::uint64_t state_;
};

struct Rgb {
  double r, g, b;
};

Rgb hsv_to_rgb(double hue, double saturation, double value) {
  const double h = 6 * (hue - std::floor(hue));
  const double c = value * saturation;
  const double x = c * (1 - std::abs(std::fmod(h, 2.0) - 1));
  const double m = value - c;
  const int sector = static_cast<int>(h) % 6;
  const Rgb table[] = {{c, x, 0}, {x, c, 0}, {0, c, x}, {0, x, c}, {x, 0, c}, {c, 0, x}};
  const Rgb& t = table[sector];
  return {t.r + m, t.g + m, t.b + m};
}

std::uint8_t clamp_byte(double v) {
  return static_cast<std::uint8_t>(std::clamp(std::lround(v), 0L, 255L));
}

void check_rgb(const Image& rgb) {
  if (rgb.channels != 3 || rgb.width <= 0 || rgb.height <= 0 ||
      rgb.pixels.size() != static_cast<std::size_t>(rgb.width) * rgb.height * 3) {
    throw Error("expected an RGB image, got " + std::to_string(rgb.width) + "x" +
                std::to_string(rgb.height) + "x" + std::to_string(rgb.channels) + " with " +
                std::to_string(rgb.pixels.size()) + " bytes");
  }
}

/// Offset of the first marker segment of type `first..last` in a JPEG header, or npos.
std::size_t find_segment(const std::vector<std::uint8_t>& jpeg,
                         std::uint8_t first,
                         std::uint8_t last) {
  std::size_t pos = 2;  // after SOI
  while (pos + 4 <= jpeg.size() && jpeg[pos] == 0xFF) {
    const std::uint8_t marker = jpeg[pos + 1];
    if (marker >= first && marker <= last) return pos;
    if (marker == 0xDA || marker == 0xD9) break;
    pos += 2 + ((std::size_t{jpeg[pos + 2]} << 8) | jpeg[pos + 3]);
  }
  return std::string::npos;
}

bool detected_as_corrupt(const std::vector<std::uint8_t>& jpeg) {
  Image image;
  return decode_image(jpeg, {}, image).error.starts_with("corrupt JPEG data");
}

/// Inverts a run of bytes of the entropy-coded scan. Some flips decode silently into wrong
/// pixels, which would make a poor test of a decoder, so the run moves along the scan until
/// libjpeg-turbo notices; as a last resort a marker is planted in the middle of the scan.
std::vector<std::uint8_t> corrupt_scan(const std::vector<std::uint8_t>& jpeg,
                                       const std::string& path) {
  const std::size_t sos = find_segment(jpeg, 0xDA, 0xDA);
  if (sos == std::string::npos) throw Error(path + ": no SOS marker to corrupt after");
  const std::size_t begin = sos + 2 + ((std::size_t{jpeg[sos + 2]} << 8) | jpeg[sos + 3]);
  const std::size_t end = jpeg.size() - 2;  // before EOI
  if (end < begin + 8) throw Error(path + ": scan too short to corrupt");
  const std::size_t span = end - begin;
  const std::size_t run = std::min<std::size_t>(16, span / 4);
  for (std::size_t i = 0; i < 64; ++i) {
    // 37 is coprime with 64: every 64th of the scan once, starting from the middle.
    const std::size_t at = begin + ((i * 37 + 32) % 64) * (span - run) / 64;
    std::vector<std::uint8_t> bytes = jpeg;
    for (std::size_t j = at; j < at + run; ++j) bytes[j] ^= 0xFF;
    if (detected_as_corrupt(bytes)) return bytes;
  }
  std::vector<std::uint8_t> bytes = jpeg;
  bytes[begin + span / 2] = 0xFF;
  bytes[begin + span / 2 + 1] = 0x05;  // not a marker libjpeg knows
  if (detected_as_corrupt(bytes)) return bytes;
  throw Error(path + ": could not corrupt the scan detectably");
}

std::vector<std::uint8_t> with_huge_dimensions(std::vector<std::uint8_t> jpeg,
                                               const std::string& path) {
  const std::size_t sof = find_segment(jpeg, 0xC0, 0xC2);  // baseline, extended, progressive
  if (sof == std::string::npos || sof + 9 > jpeg.size()) {
    throw Error(path + ": no SOF header to patch");
  }
  for (const std::size_t at : {sof + 5, sof + 7}) {  // height, then width, big-endian
    jpeg[at] = static_cast<std::uint8_t>(kHugeSide >> 8);
    jpeg[at + 1] = static_cast<std::uint8_t>(kHugeSide & 0xFF);
  }
  return jpeg;
}

int digits(std::size_t n) { return n < 10 ? 1 : 1 + digits(n / 10); }

std::string numbered(const char* prefix, std::size_t n, int width, const char* suffix) {
  std::string number = std::to_string(n);
  if (static_cast<int>(number.size()) < width) number.insert(0, width - number.size(), '0');
  return prefix + number + suffix;
}

void check_options(const SyntheticOptions& o) {
  std::string problem;
  if (o.root.empty()) problem = "root is empty";
  if (o.width < 8 || o.height < 8 || o.width > 65500 || o.height > 65500) {
    problem = "width and height must be 8..65500, not " + std::to_string(o.width) + "x" +
              std::to_string(o.height);
  }
  if (o.classes < 1) problem = "classes must be >= 1, not " + std::to_string(o.classes);
  if (o.quality < 1 || o.quality > 100) {
    problem = "quality must be 1..100, not " + std::to_string(o.quality);
  }
  if (!(o.broken_fraction >= 0 && o.broken_fraction <= 1)) {
    problem = "broken_fraction must be 0..1, not " + std::to_string(o.broken_fraction);
  }
  if (!problem.empty()) throw Error("synthetic dataset " + o.root + ": " + problem);
}

}  // namespace

const char* to_string(BrokenKind kind) {
  switch (kind) {
    case BrokenKind::kNone:
      return "none";
    case BrokenKind::kEmpty:
      return "empty";
    case BrokenKind::kTruncated:
      return "truncated";
    case BrokenKind::kNotAnImage:
      return "not_an_image";
    case BrokenKind::kCorruptData:
      return "corrupt_data";
    case BrokenKind::kHugeDimensions:
      return "huge_dimensions";
    case BrokenKind::kUnreadable:
      return "unreadable";
  }
  return "?";
}

std::size_t GeneratedDataset::broken_count() const {
  return static_cast<std::size_t>(std::count_if(
      files.begin(), files.end(), [](const auto& f) { return f.broken != BrokenKind::kNone; }));
}

Image render_synthetic_image(std::int64_t label,
                             int classes,
                             int width,
                             int height,
                             std::uint64_t seed,
                             std::uint64_t index) {
  constexpr double kTwoPi = 2 * std::numbers::pi;
  // Class: hue evenly around the wheel; stripes at a golden-angle step (neighbouring classes far
  // apart) with 2..4 cycles across the image. Image: phase, brightness, noise.
  const Rgb base = hsv_to_rgb(static_cast<double>(label) / std::max(classes, 1), 0.65, 0.85);
  const double angle = std::fmod(static_cast<double>(label) * 2.399963229728653, std::numbers::pi);
  const double cycles = 2.0 + static_cast<double>(label % 3);
  Rng rng(seed * 0x9e3779b97f4a7c15ULL + index);
  rng.next();
  const double phase = kTwoPi * rng.uniform();
  const double brightness = 0.85 + 0.3 * rng.uniform();
  const double kx = kTwoPi * cycles * std::cos(angle) / width;
  const double ky = kTwoPi * cycles * std::sin(angle) / height;

  Image image;
  image.width = width;
  image.height = height;
  image.channels = 3;
  image.pixels.resize(static_cast<std::size_t>(width) * height * 3);
  std::uint8_t* p = image.pixels.data();
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x, p += 3) {
      const double shade = 255 * brightness * (0.75 + 0.25 * std::sin(kx * x + ky * y + phase));
      const std::uint64_t noise = rng.next();  // one draw, a byte per channel: +-16 levels
      p[0] = clamp_byte(base.r * shade + static_cast<double>(noise % 33) - 16);
      p[1] = clamp_byte(base.g * shade + static_cast<double>((noise >> 8) % 33) - 16);
      p[2] = clamp_byte(base.b * shade + static_cast<double>((noise >> 16) % 33) - 16);
    }
  }
  return image;
}

std::vector<std::uint8_t> encode_jpeg(const Image& rgb, int quality) {
  check_rgb(rgb);
  return compress_jpeg(rgb.pixels.data(), rgb.width, rgb.height, 0, TJPF_RGB, TJSAMP_420, quality,
                       0);
}

std::vector<std::uint8_t> encode_gray_jpeg(const Image& rgb, int quality) {
  check_rgb(rgb);
  const cv::Mat color(rgb.height, rgb.width, CV_8UC3, const_cast<std::uint8_t*>(rgb.pixels.data()));
  cv::Mat gray;
  cv::cvtColor(color, gray, cv::COLOR_RGB2GRAY);
  // The bytes cv::imencode(".jpg") wrote here before (its accurate DCT), without imgcodecs.
  return compress_jpeg(gray.data, gray.cols, gray.rows, static_cast<int>(gray.step), TJPF_GRAY,
                       TJSAMP_GRAY, quality, TJFLAG_ACCURATEDCT);
}

std::vector<std::uint8_t> encode_cmyk_jpeg(const Image& rgb, int quality) {
  check_rgb(rgb);
  // Inverted CMYK: k' = 255 - K = max(r, g, b), and c' = 255 - C = 255 r / max, so that
  // r = c' k' / 255 (what decoders compute for Adobe CMYK).
  std::vector<std::uint8_t> cmyk(rgb.pixels.size() / 3 * 4);
  const std::uint8_t* in = rgb.pixels.data();
  for (std::uint8_t* out = cmyk.data(); out != cmyk.data() + cmyk.size(); out += 4, in += 3) {
    const unsigned k = std::max({in[0], in[1], in[2]});
    for (int c = 0; c < 3; ++c) {
      out[c] = static_cast<std::uint8_t>(k == 0 ? 255 : (in[c] * 255u + k / 2) / k);
    }
    out[3] = static_cast<std::uint8_t>(k);
  }
  return compress_jpeg(cmyk.data(), rgb.width, rgb.height, 0, TJPF_CMYK, TJSAMP_444, quality, 0);
}

void write_file(const std::string& path, std::span<const std::uint8_t> bytes) {
  write_file_atomically(path,
                        {reinterpret_cast<const char*>(bytes.data()), bytes.size()});
}

GeneratedDataset generate_jpeg_dataset(const SyntheticOptions& options) {
  check_options(options);
  GeneratedDataset dataset;
  dataset.root = options.root;
  const std::size_t count = options.count;
  const auto classes = static_cast<std::size_t>(options.classes);

  // Broken files spread evenly over the indices, their kinds in turn.
  std::map<std::size_t, BrokenKind> broken;
  const auto broken_total =
      static_cast<std::size_t>(std::llround(static_cast<double>(count) * options.broken_fraction));
  for (std::size_t j = 0; j < broken_total; ++j) {
    broken[(2 * j + 1) * count / (2 * broken_total)] = kBrokenKinds[j % std::size(kBrokenKinds)];
  }

  // Zero-padded so that sorted folder names give the labels (ImageFolder's rule).
  const int class_digits = std::max(2, digits(classes - 1));
  const int index_digits = std::max(5, digits(count == 0 ? 0 : count - 1));
  std::vector<std::string> class_dirs;
  for (std::size_t c = 0; c < classes; ++c) {
    class_dirs.push_back(
        (fs::path(options.root) / numbered("class_", c, class_digits, "")).string());
    std::error_code ec;
    fs::create_directories(class_dirs.back(), ec);
    if (ec) throw Error(class_dirs.back() + ": cannot create folder: " + ec.message());
  }

  dataset.files.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    const auto label = static_cast<std::int64_t>(i % classes);
    const std::string name = numbered("img_", i, index_digits, ".jpg");
    GeneratedFile file{(fs::path(class_dirs[i % classes]) / name).string(), label,
                       BrokenKind::kNone};
    if (const auto it = broken.find(i); it != broken.end()) file.broken = it->second;

    std::vector<std::uint8_t> bytes;
    if (file.broken != BrokenKind::kEmpty && file.broken != BrokenKind::kNotAnImage &&
        file.broken != BrokenKind::kUnreadable) {
      const Image image = render_synthetic_image(label, options.classes, options.width,
                                                 options.height, options.seed, i);
      bytes = compress_jpeg(image.pixels.data(), image.width, image.height, 0, TJPF_RGB,
                            TJSAMP_420, options.quality, 0);
    }
    switch (file.broken) {
      case BrokenKind::kNone:
      case BrokenKind::kEmpty:
        break;
      case BrokenKind::kTruncated:
        bytes.resize(bytes.size() * 6 / 10);
        break;
      case BrokenKind::kNotAnImage: {
        const std::string text =
            "flowtrain synthetic dataset: " + name + " is deliberately not an image.\n";
        bytes.assign(text.begin(), text.end());
        break;
      }
      case BrokenKind::kCorruptData:
        bytes = corrupt_scan(bytes, file.path);
        break;
      case BrokenKind::kHugeDimensions:
        bytes = with_huge_dimensions(std::move(bytes), file.path);
        break;
      case BrokenKind::kUnreadable: {
        std::error_code ec;
        fs::remove(file.path, ec);
        fs::create_symlink("missing-" + name, file.path, ec);  // dangles: no such target
        if (ec) throw Error(file.path + ": cannot create symlink: " + ec.message());
        break;
      }
    }
    if (file.broken != BrokenKind::kUnreadable) write_file(file.path, bytes);
    dataset.files.push_back(std::move(file));
  }
  return dataset;
}

}  // namespace flowtrain::data
