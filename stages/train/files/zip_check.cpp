#include "stages/train/files/zip_check.hpp"

#include <zlib.h>

#include <caffe2/serialize/versions.h>  // two constants, no LibTorch

#include <algorithm>
#include <cctype>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <optional>
#include <set>
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

// Pieces of a stored entry a check reads at a time before giving them back (ReleasePages).
constexpr std::size_t kCheckPiece = std::size_t{16} << 20;

// Inflates the raw deflate stream `data` into `out` if given (exactly `expected` bytes), else
// into a small buffer; returns its CRC-32, or nullopt if it does not inflate to exactly
// `expected` bytes (it stops once past them: a deflate bomb costs no more than it claims).
std::optional<uLong> inflated_crc(std::span<const std::uint8_t> data,
                                  std::uint64_t expected,
                                  std::span<std::uint8_t> out,
                                  const ReleasePages& release) {
  z_stream z{};
  if (inflateInit2(&z, -MAX_WBITS) != Z_OK) return std::nullopt;
  z.next_in = const_cast<Bytef*>(data.data());
  std::size_t left = data.size();  // fed a piece at a time (avail_in is 32 bits)
  std::size_t released = 0;
  Bytef scratch[16384];
  uLong crc = ::crc32_z(0, nullptr, 0);
  std::uint64_t total = 0;
  int rc = Z_OK;
  while (rc == Z_OK) {
    if (z.avail_in == 0 && left > 0) {
      const std::size_t fed = data.size() - left;
      if (release && fed > released) release(data.subspan(released, fed - released));
      released = fed;
      z.avail_in = static_cast<uInt>(std::min<std::size_t>(left, kCheckPiece));
      left -= z.avail_in;
    }
    Bytef* into = scratch;
    std::size_t room = sizeof scratch;
    if (!out.empty()) {
      into = out.data() + total;
      room = static_cast<std::size_t>(std::min<std::uint64_t>(out.size() - total, kCheckPiece));
      if (room == 0) {  // full: one byte more would be past `expected`
        into = scratch;
        room = 1;
      }
    }
    z.next_out = into;
    z.avail_out = static_cast<uInt>(room);
    rc = inflate(&z, Z_NO_FLUSH);
    const std::size_t produced = room - z.avail_out;
    crc = ::crc32_z(crc, into, produced);
    total += produced;
    if (total > expected) rc = Z_DATA_ERROR;
    if (rc == Z_OK && produced == 0 && z.avail_in == 0 && left == 0) rc = Z_DATA_ERROR;  // truncated
  }
  inflateEnd(&z);
  if (release && data.size() > released) release(data.subspan(released));
  if (rc != Z_STREAM_END || total != expected) return std::nullopt;
  return crc;
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
// are checked here.
std::string libtorch_layout_problem(const std::vector<ZipEntry>& entries) {
  if (entries.empty()) return "no entries";
  const std::string_view first = entries.front().name;
  const std::size_t slash = first.find('/');
  if (slash == std::string::npos) return "entry '" + std::string(first) + "' is not in a folder";
  const std::string folder(first.substr(0, slash + 1));
  // LibTorch 1.13 reads ".data/version" if there is one, else "version".
  const auto find = [&](const std::string& name) {
    return std::find_if(entries.begin(), entries.end(),
                        [&](const ZipEntry& e) { return same_name(e.name, folder + name); });
  };
  auto version = find(".data/version");
  if (version == entries.end()) version = find("version");
  if (version == entries.end()) return "no entry '" + folder + "version'";
  // The number as std::stoull reads it: blanks, then digits (anything after them is ignored).
  // Stored as LibTorch writes it (a compressed one reads as no number).
  const std::span<const std::uint8_t> text =
      version->method == 0 ? version->data : std::span<const std::uint8_t>{};
  std::size_t at = 0;
  while (at < text.size() && std::isspace(text[at])) ++at;
  std::uint64_t number = 0;
  std::size_t digits = 0;
  for (; at < text.size() && std::isdigit(text[at]) && digits < 19; ++at, ++digits) {
    number = number * 10 + (text[at] - '0');
  }
  if (digits == 0 || number < caffe2::serialize::kMinSupportedFileFormatVersion ||
      number > caffe2::serialize::kMaxSupportedFileFormatVersion) {
    return "entry '" + std::string(version->name) + "' does not hold a format version LibTorch reads (" +
           std::to_string(caffe2::serialize::kMinSupportedFileFormatVersion) + " to " +
           std::to_string(caffe2::serialize::kMaxSupportedFileFormatVersion) + ")";
  }
  return {};
}

}  // namespace

std::vector<ZipEntry> zip_entries(std::span<const std::uint8_t> bytes, std::string& problem) {
  const auto fail = [&](std::string why) {
    problem = std::move(why);
    return std::vector<ZipEntry>{};
  };
  const std::uint64_t size = bytes.size();
  const std::uint8_t* data = bytes.data();
  const std::optional<std::size_t> found = end_of_directory(bytes);
  if (!found) return fail("no zip directory");
  const std::uint64_t end = *found;
  std::uint64_t count = u16(data + end + 10);
  std::uint64_t directory_size = u32(data + end + 12);
  std::uint64_t directory = u32(data + end + 16);
  // A ZIP64 record (LibTorch writes one into every file) holds the directory's true place and
  // count, and zip readers (LibTorch's miniz) take them from it when its locator is there.
  if (end >= 20 && u32(data + end - 20) == kZip64Locator) {
    const std::uint64_t record = u64(data + end - 20 + 8);
    if (!inside(record, 56, end - 20) || u32(data + record) != kZip64EndOfDirectory) {
      return fail("damaged ZIP64 directory record");
    }
    count = u64(data + record + 32);
    directory_size = u64(data + record + 40);
    directory = u64(data + record + 48);
  }
  if (!inside(directory, directory_size, end)) return fail("zip directory outside the file");

  std::vector<ZipEntry> entries;
  std::uint64_t at = directory;
  for (std::uint64_t i = 0; i < count; ++i) {
    if (!inside(at, 46, end) || u32(data + at) != kDirectoryEntry) return fail("damaged zip directory");
    const std::uint32_t method = u16(data + at + 10);
    const std::uint32_t crc = u32(data + at + 16);
    std::uint64_t stored = u32(data + at + 20);
    std::uint64_t unpacked = u32(data + at + 24);
    const std::uint32_t name_size = u16(data + at + 28);
    const std::uint32_t extra_size = u16(data + at + 30);
    std::uint64_t local = u32(data + at + 42);
    const std::uint64_t next = at + 46 + name_size + extra_size + u16(data + at + 32);
    if (next > end) return fail("damaged zip directory");
    const std::string_view name_in_file(reinterpret_cast<const char*>(data + at + 46), name_size);
    const std::string name(name_in_file);
    if (const std::string zip64 = read_zip64_fields(
            bytes.subspan(at + 46 + name_size, extra_size), {&unpacked, &stored, &local});
        !zip64.empty()) {
      return fail("entry '" + name + "' " + zip64);
    }
    if (!inside(local, 30, size) || u32(data + local) != kLocalHeader) {
      return fail("entry '" + name + "' has no header");
    }
    const std::uint64_t begin = local + 30 + u16(data + local + 26) + u16(data + local + 28);
    if (!inside(begin, stored, size)) {
      return fail("entry '" + name + "' runs past the end of the file");
    }
    if (method != 0 && method != 8) {
      return fail("entry '" + name + "' is stored by an unknown method " + std::to_string(method));
    }
    if (method == 0 && stored != unpacked) return fail("entry '" + name + "' fails its CRC check");
    if (method == 8 && unpacked > kMaxInflatedEntry) {
      return fail("entry '" + name + "' inflates to " + std::to_string(unpacked) +
                  " bytes, more than the " + std::to_string(kMaxInflatedEntry >> 20) +
                  " MiB a compressed entry of LibTorch's may");
    }
    entries.push_back({.name = name_in_file,
                       .method = method,
                       .crc = crc,
                       .size = unpacked,
                       .data = bytes.subspan(begin, stored)});
    at = next;
  }
  // Two entries of one name: zip readers differ in which they take.
  std::set<std::string> names;
  for (const ZipEntry& entry : entries) {
    std::string lower(entry.name);
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (!names.insert(std::move(lower)).second) {
      return fail("entry '" + std::string(entry.name) + "' appears twice");
    }
  }
  if (std::string layout = libtorch_layout_problem(entries); !layout.empty()) {
    return fail(std::move(layout));
  }
  return entries;
}

const ZipEntry* find_entry(const std::vector<ZipEntry>& entries, std::string_view name) {
  const std::string_view first = entries.front().name;
  const std::string full = std::string(first.substr(0, first.find('/') + 1)).append(name);
  const auto found = std::find_if(entries.begin(), entries.end(),
                                  [&](const ZipEntry& e) { return same_name(e.name, full); });
  return found == entries.end() ? nullptr : &*found;
}

namespace {

// `entry`'s contents checked against its CRC-32 and size, a piece at a time, each given to
// `release` once read: copied into `out` if given (then exactly the contents' size), else only
// read. The problem, or an empty string.
std::string checked(const ZipEntry& entry, std::span<std::uint8_t> out, const ReleasePages& release) {
  const std::string name(entry.name);
  uLong crc = ::crc32_z(0, nullptr, 0);
  if (entry.method == 8) {
    const std::optional<uLong> inflated = inflated_crc(entry.data, entry.size, out, release);
    if (!inflated) return "entry '" + name + "' does not inflate to its size";
    crc = *inflated;
  } else {
    for (std::size_t at = 0; at < entry.data.size(); at += kCheckPiece) {
      const auto piece = entry.data.subspan(at, std::min(kCheckPiece, entry.data.size() - at));
      if (!out.empty()) std::memcpy(out.data() + at, piece.data(), piece.size());
      crc = ::crc32_z(crc, piece.data(), piece.size());
      if (release) release(piece);
    }
  }
  return crc == entry.crc ? std::string() : "entry '" + name + "' fails its CRC check";
}

}  // namespace

std::string entry_problem(const ZipEntry& entry, const ReleasePages& release) {
  return checked(entry, {}, release);
}

std::string read_entry(const ZipEntry& entry,
                       std::span<std::uint8_t> out,
                       const ReleasePages& release) {
  if (out.size() != entry.size) {
    return "entry '" + std::string(entry.name) + "' holds " + std::to_string(entry.size) +
           " bytes, not " + std::to_string(out.size());
  }
  return checked(entry, out, release);
}

std::string zip_problem(std::span<const std::uint8_t> bytes, const ReleasePages& release) {
  std::string problem;
  for (const ZipEntry& entry : zip_entries(bytes, problem)) {
    problem = entry_problem(entry, release);
    if (!problem.empty()) return problem;
  }
  return problem;
}

bool has_zip_directory(std::span<const std::uint8_t> bytes) {
  return end_of_directory(bytes).has_value();
}

MappedFile read_checked_archive(const std::string& path, const std::string& kind) {
  MappedFile file(path);
  // Not a zip archive at all: LibTorch says what it is not. Anything a zip reader would open
  // (it looks for the directory at the end, whatever the first bytes) is checked.
  if (!has_zip_directory(file.bytes())) return file;
  const std::string problem =
      zip_problem(file.bytes(), [&file](std::span<const std::uint8_t> part) { file.release(part); });
  if (!problem.empty()) throw Error(path + ": damaged " + kind + " (" + problem + ")");
  return file;
}

}  // namespace flowtrain::train
