#include "stages/train/files/zip_check.hpp"

#include <zlib.h>

#include <caffe2/serialize/versions.h>  // two constants, no LibTorch

#include <algorithm>
#include <cctype>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string_view>
#include <utility>

#include "graph/error.hpp"
#include "graph/read_file.hpp"

namespace flowtrain::train {

namespace {

std::uint32_t u16(const std::uint8_t* p) { return p[0] | (p[1] << 8); }
std::uint32_t u32(const std::uint8_t* p) {
  return p[0] | (p[1] << 8) | (p[2] << 16) | (static_cast<std::uint32_t>(p[3]) << 24);
}
std::uint64_t u64(const std::uint8_t* p) { return u32(p) | (std::uint64_t{u32(p + 4)} << 32); }

constexpr std::uint32_t kEndOfDirectory = 0x06054b50;
constexpr std::uint32_t kDirectoryEntry = 0x02014b50;
constexpr std::uint32_t kLocalHeader = 0x04034b50;
constexpr std::uint32_t kZip64Locator = 0x07064b50;
constexpr std::uint32_t kZip64EndOfDirectory = 0x06064b50;
constexpr std::uint32_t kZip64 = 0xffffffff;  // "see the ZIP64 field"

// The CRC-32 of a raw deflate stream's output, and its size; nullopt if it does not inflate.
std::optional<std::pair<uLong, std::uint64_t>> inflated_crc(const std::uint8_t* data,
                                                            std::size_t size) {
  z_stream z{};
  if (inflateInit2(&z, -MAX_WBITS) != Z_OK) return std::nullopt;
  z.next_in = const_cast<Bytef*>(data);
  std::size_t left = size;  // fed at most 4 GiB at a time (avail_in is 32 bits)
  Bytef out[16384];
  uLong crc = ::crc32_z(0, nullptr, 0);
  std::uint64_t total = 0;
  int rc = Z_OK;
  while (rc == Z_OK) {
    if (z.avail_in == 0 && left > 0) {
      z.avail_in = static_cast<uInt>(std::min<std::size_t>(left, std::numeric_limits<uInt>::max()));
      left -= z.avail_in;
    }
    z.next_out = out;
    z.avail_out = sizeof out;
    rc = inflate(&z, Z_NO_FLUSH);
    const std::size_t produced = sizeof out - z.avail_out;
    crc = ::crc32_z(crc, out, produced);
    total += produced;
    if (rc == Z_OK && produced == 0 && z.avail_in == 0 && left == 0) rc = Z_DATA_ERROR;  // truncated
  }
  inflateEnd(&z);
  if (rc != Z_STREAM_END) return std::nullopt;
  return std::pair{crc, total};
}

// Where the end-of-directory record is: 22 bytes and a comment of up to 65535, at the end (where
// zip readers, LibTorch's among them, look for it); nullopt if there is none.
std::optional<std::size_t> end_of_directory(std::span<const std::uint8_t> bytes) {
  if (bytes.size() < 22) return std::nullopt;
  const std::size_t lowest = bytes.size() - std::min<std::size_t>(bytes.size(), 22 + 0xffff);
  for (std::size_t end = bytes.size() - 22;; --end) {
    if (u32(bytes.data() + end) == kEndOfDirectory) return end;
    if (end == lowest) return std::nullopt;
  }
}

// Whether `length` bytes at `offset` lie inside `size` (without overflowing).
bool inside(std::uint64_t offset, std::uint64_t length, std::uint64_t size) {
  return offset <= size && length <= size - offset;
}

// An entry's sizes and offset of kZip64 are in its ZIP64 extra field (id 1), 8 bytes each in the
// order given: replaces those of `values` from `extra` (the entry's extra fields). Returns the
// problem, or an empty string (also when none of `values` is kZip64).
std::string read_zip64_fields(std::span<const std::uint8_t> extra,
                              std::initializer_list<std::uint64_t*> values) {
  if (std::none_of(values.begin(), values.end(), [](auto* v) { return *v == kZip64; })) return {};
  std::size_t at = 0;
  while (at + 4 <= extra.size() && u16(&extra[at]) != 1) at += 4 + u16(&extra[at + 2]);
  if (at + 4 > extra.size()) return "has no ZIP64 field";
  const std::size_t end = std::min(extra.size(), at + 4 + u16(&extra[at + 2]));
  at += 4;
  for (std::uint64_t* value : values) {
    if (*value != kZip64) continue;
    if (at + 8 > end) return "has a damaged ZIP64 field";
    *value = u64(&extra[at]);
    at += 8;
  }
  return {};
}

// Names as LibTorch's zip reader (miniz) looks them up: ASCII case ignored.
bool same_name(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

// What LibTorch's reader requires of an archive before it parses anything: a first entry in a
// folder, and a "version" entry in that folder holding a number it supports. LibTorch 1.13
// throws from its reader's constructor when one is missing, after its zip reader has allocated
// the directory (the destructor that frees it never runs: a leak per damaged file), so these
// are checked here. `entries` are (name, stored contents or empty if compressed).
std::string libtorch_layout_problem(
    const std::vector<std::pair<std::string_view, std::span<const std::uint8_t>>>& entries) {
  if (entries.empty()) return "no entries";
  const std::string_view first = entries.front().first;
  const std::size_t slash = first.find('/');
  if (slash == std::string::npos) return "entry '" + std::string(first) + "' is not in a folder";
  const std::string folder(first.substr(0, slash + 1));
  // LibTorch 1.13 reads ".data/version" if there is one, else "version".
  const auto find = [&](const std::string& name) {
    return std::find_if(entries.begin(), entries.end(),
                        [&](const auto& e) { return same_name(e.first, folder + name); });
  };
  auto version = find(".data/version");
  if (version == entries.end()) version = find("version");
  if (version == entries.end()) return "no entry '" + folder + "version'";
  // The number as std::stoull reads it: blanks, then digits (anything after them is ignored).
  const std::span<const std::uint8_t> text = version->second;
  std::size_t at = 0;
  while (at < text.size() && std::isspace(text[at])) ++at;
  std::uint64_t number = 0;
  std::size_t digits = 0;
  for (; at < text.size() && std::isdigit(text[at]) && digits < 19; ++at, ++digits) {
    number = number * 10 + (text[at] - '0');
  }
  if (digits == 0 || number < caffe2::serialize::kMinSupportedFileFormatVersion ||
      number > caffe2::serialize::kMaxSupportedFileFormatVersion) {
    return "entry '" + std::string(version->first) + "' does not hold a format version LibTorch reads (" +
           std::to_string(caffe2::serialize::kMinSupportedFileFormatVersion) + " to " +
           std::to_string(caffe2::serialize::kMaxSupportedFileFormatVersion) + ")";
  }
  return {};
}

}  // namespace

std::string zip_problem(std::span<const std::uint8_t> bytes) {
  const std::uint64_t size = bytes.size();
  const std::uint8_t* data = bytes.data();
  const std::optional<std::size_t> found = end_of_directory(bytes);
  if (!found) return "no zip directory";
  const std::uint64_t end = *found;
  std::uint64_t count = u16(data + end + 10);
  std::uint64_t directory_size = u32(data + end + 12);
  std::uint64_t directory = u32(data + end + 16);
  // A ZIP64 record (LibTorch writes one into every file) holds the directory's true place and
  // count, and zip readers (LibTorch's miniz) take them from it when its locator is there.
  if (end >= 20 && u32(data + end - 20) == kZip64Locator) {
    const std::uint64_t record = u64(data + end - 20 + 8);
    if (!inside(record, 56, end - 20) || u32(data + record) != kZip64EndOfDirectory) {
      return "damaged ZIP64 directory record";
    }
    count = u64(data + record + 32);
    directory_size = u64(data + record + 40);
    directory = u64(data + record + 48);
  }
  if (!inside(directory, directory_size, end)) return "zip directory outside the file";

  std::vector<std::pair<std::string_view, std::span<const std::uint8_t>>> entries;
  std::uint64_t at = directory;
  for (std::uint64_t i = 0; i < count; ++i) {
    if (!inside(at, 46, end) || u32(data + at) != kDirectoryEntry) return "damaged zip directory";
    const std::uint32_t method = u16(data + at + 10);
    const std::uint32_t crc = u32(data + at + 16);
    std::uint64_t stored = u32(data + at + 20);
    std::uint64_t unpacked = u32(data + at + 24);
    const std::uint32_t name_size = u16(data + at + 28);
    const std::uint32_t extra_size = u16(data + at + 30);
    std::uint64_t local = u32(data + at + 42);
    const std::uint64_t next = at + 46 + name_size + extra_size + u16(data + at + 32);
    if (next > end) return "damaged zip directory";
    const std::string_view name_in_file(reinterpret_cast<const char*>(data + at + 46), name_size);
    const std::string name(name_in_file);
    if (const std::string problem = read_zip64_fields(
            bytes.subspan(at + 46 + name_size, extra_size), {&unpacked, &stored, &local});
        !problem.empty()) {
      return "entry '" + name + "' " + problem;
    }
    if (!inside(local, 30, size) || u32(data + local) != kLocalHeader) {
      return "entry '" + name + "' has no header";
    }
    const std::uint64_t begin = local + 30 + u16(data + local + 26) + u16(data + local + 28);
    if (!inside(begin, stored, size)) return "entry '" + name + "' runs past the end of the file";
    if (method == 0) {
      if (stored != unpacked || ::crc32_z(0, data + begin, stored) != crc) {
        return "entry '" + name + "' fails its CRC check";
      }
    } else if (method == 8) {  // deflate: LibTorch's code entries
      const auto inflated = inflated_crc(data + begin, stored);
      if (!inflated) return "entry '" + name + "' does not inflate";
      if (inflated->first != crc || inflated->second != unpacked) {
        return "entry '" + name + "' fails its CRC check";
      }
    } else {
      return "entry '" + name + "' is stored by an unknown method " + std::to_string(method);
    }
    entries.emplace_back(
        name_in_file, method == 0 ? bytes.subspan(begin, stored) : std::span<const std::uint8_t>{});
    at = next;
  }
  return libtorch_layout_problem(entries);
}

void read_checked_archive(const std::string& path,
                          const std::string& kind,
                          std::vector<std::uint8_t>& buffer,
                          std::span<const std::uint8_t>& bytes) {
  if (const std::string problem =
          read_file(path, buffer, bytes, std::numeric_limits<std::int64_t>::max());
      !problem.empty()) {
    throw Error(path + ": cannot read (" + problem + ")");
  }
  // Not a zip archive at all: LibTorch says what it is not. Anything a zip reader would open
  // (it looks for the directory at the end, whatever the first bytes) is checked.
  if (!end_of_directory(bytes)) return;
  if (const std::string problem = zip_problem(bytes); !problem.empty()) {
    throw Error(path + ": damaged " + kind + " (" + problem + ")");
  }
}

}  // namespace flowtrain::train
