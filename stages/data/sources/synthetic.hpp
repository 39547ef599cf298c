#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "stages/data/sample.hpp"

namespace flowtrain::data {

/// What a generated file is: a valid JPEG, or one of the broken files a decoder must survive.
enum class BrokenKind {
  kNone,
  kEmpty,           ///< zero bytes
  kTruncated,       ///< a valid JPEG cut at 60% of its length
  kNotAnImage,      ///< a text file with a .jpg name
  kCorruptData,     ///< a run of bytes inverted in the entropy-coded data after the SOS marker
  kHugeDimensions,  ///< a valid JPEG whose SOF header claims 60000x60000 pixels
  kUnreadable,      ///< a dangling symbolic link (chmod does not stop root, who runs the tests)
};

/// The broken kinds in the order generate_jpeg_dataset cycles through them.
inline constexpr BrokenKind kBrokenKinds[] = {BrokenKind::kEmpty,          BrokenKind::kTruncated,
                                              BrokenKind::kNotAnImage,     BrokenKind::kCorruptData,
                                              BrokenKind::kHugeDimensions, BrokenKind::kUnreadable};

/// "none", "empty", "truncated", "not_an_image", "corrupt_data", "huge_dimensions", "unreadable".
const char* to_string(BrokenKind kind);

/// What generate_jpeg_dataset writes.
struct SyntheticOptions {
  std::string root;          ///< output folder, created if missing
  std::size_t count = 1000;  ///< files in all
  int width = 64;
  int height = 64;
  int classes = 10;
  int quality = 90;  ///< JPEG quality, 1..100
  std::uint64_t seed = 0;
  double broken_fraction = 0;  ///< share of the files written broken, the kinds in turn
};

/// One file written: where, its class, and how it is broken (if at all).
struct GeneratedFile {
  std::string path;
  std::int64_t label = -1;
  BrokenKind broken = BrokenKind::kNone;
};

/// The manifest of a generated dataset, files in index order.
struct GeneratedDataset {
  std::string root;
  std::vector<GeneratedFile> files;

  std::size_t broken_count() const;
};

/// Writes `count` JPEGs in ImageFolder layout, root/class_XX/img_XXXXX.jpg (file i in class
/// i % classes), and returns what it wrote. Each class has its own hue and stripe direction and
/// frequency; each image a random stripe phase, brightness and pixel noise, so the class can be
/// learned from the pixels but no two images are equal. round(count * broken_fraction) files,
/// spread evenly over the indices, are broken, cycling through kBrokenKinds. Deterministic in
/// the options. Existing files at those paths are replaced, others left alone. Throws Error
/// naming the path when a file cannot be written.
GeneratedDataset generate_jpeg_dataset(const SyntheticOptions& options);

/// The pixels (RGB) of image `index` of class `label` as generate_jpeg_dataset draws them.
Image render_synthetic_image(std::int64_t label,
                             int classes,
                             int width,
                             int height,
                             std::uint64_t seed,
                             std::uint64_t index);

/// Encodes an RGB image as a baseline JPEG with 4:2:0 chroma subsampling (TurboJPEG).
std::vector<std::uint8_t> encode_jpeg(const Image& rgb, int quality);

/// Encodes the luma of an RGB image as a one-channel grayscale JPEG (OpenCV's luma, TurboJPEG).
std::vector<std::uint8_t> encode_gray_jpeg(const Image& rgb, int quality);

/// Encodes an RGB image as a CMYK JPEG the way Photoshop stores one: inverted CMYK (0 = full
/// ink) with an Adobe marker, YCCK-transformed, 4:4:4 (TurboJPEG, TJPF_CMYK).
std::vector<std::uint8_t> encode_cmyk_jpeg(const Image& rgb, int quality);

/// Writes `bytes` to `path`, replacing the file; throws Error naming the path on failure.
void write_file(const std::string& path, std::span<const std::uint8_t> bytes);

}  // namespace flowtrain::data
