#include "stages/data/sources/shard.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <turbojpeg.h>

#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>

#include "graph/error.hpp"
#include "stages/data/decode/image_decode.hpp"
#include "stages/data/decode/jpeg_encode.hpp"
#include "stages/data/splitmix.hpp"

namespace flowtrain::data {

// The format is little-endian IEEE; this build writes and maps it as is.
static_assert(std::endian::native == std::endian::little, "shards assume a little-endian host");
static_assert(std::numeric_limits<float>::is_iec559, "shards store IEEE 754 floats");

namespace {

std::string errno_text() { return std::strerror(errno); }

template <class T>
T load(const std::uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace

// ---------------------------------------------------------------------------------- ShardWriter

ShardWriter::ShardWriter(std::string path) : file_(std::move(path)) {
  const std::uint32_t version = kShardVersion;
  const std::uint64_t reserved = 0;
  file_.write(kShardMagic, sizeof kShardMagic);
  file_.write(&version, sizeof version);
  file_.write(&reserved, sizeof reserved);
}

void ShardWriter::add(std::span<const std::uint8_t> bytes,
                      std::int64_t label,
                      std::span<const float> targets,
                      std::string_view source_path) {
  if (finished_) throw Error(path() + ": add after finish");
  if (labels_.empty()) {
    target_count_ = targets.size();
  } else if (targets.size() != target_count_) {
    throw Error(path() + ": record " + std::to_string(labels_.size()) + " (" +
                std::string(source_path) + ") has " + std::to_string(targets.size()) +
                " targets, the first record had " + std::to_string(target_count_));
  }
  offsets_.push_back(file_.size());
  sizes_.push_back(bytes.size());
  file_.write(bytes.data(), bytes.size());
  labels_.push_back(label);
  checksums_.push_back(hash_bytes(bytes));
  targets_.insert(targets_.end(), targets.begin(), targets.end());
  paths_.append(source_path);
  path_ends_.push_back(paths_.size());
}

void ShardWriter::finish() {
  if (finished_) throw Error(path() + ": finish called twice");
  finished_ = true;
  // The index starts 8-aligned so its tables are aligned in the mapping.
  static constexpr std::uint8_t kZeros[8] = {};
  file_.write(kZeros, (8 - file_.size() % 8) % 8);
  const std::uint64_t index_offset = file_.size();

  // The index is built in memory, so that its checksum covers it as one span.
  std::vector<std::uint8_t> index;
  const auto append = [&index](const void* data, std::size_t size) {
    const auto* bytes = static_cast<const std::uint8_t*>(data);
    index.insert(index.end(), bytes, bytes + size);
  };
  const std::uint64_t count = labels_.size();
  const std::uint32_t target_count = static_cast<std::uint32_t>(target_count_);
  const std::uint32_t reserved = 0;
  append(&count, sizeof count);
  append(&target_count, sizeof target_count);
  append(&reserved, sizeof reserved);
  std::uint64_t path_begin = 0;
  for (std::size_t i = 0; i < labels_.size(); ++i) {
    const std::uint64_t entry[6] = {offsets_[i],
                                    sizes_[i],
                                    static_cast<std::uint64_t>(labels_[i]),
                                    path_begin,
                                    path_ends_[i] - path_begin,
                                    checksums_[i]};
    static_assert(sizeof entry == kShardRecordEntrySize);
    append(entry, sizeof entry);
    path_begin = path_ends_[i];
  }
  append(targets_.data(), targets_.size() * sizeof(float));
  append(paths_.data(), paths_.size());
  file_.write(index.data(), index.size());

  const std::uint64_t index_size = index.size();
  const std::uint64_t index_checksum = hash_bytes(index);
  const std::uint32_t version = kShardVersion;
  file_.write(&index_offset, sizeof index_offset);
  file_.write(&index_size, sizeof index_size);
  file_.write(&index_checksum, sizeof index_checksum);
  file_.write(&version, sizeof version);
  file_.write(kShardMagic, sizeof kShardMagic);

  file_.commit();
}

// ---------------------------------------------------------------------------------- ShardReader

ShardReader::ShardReader(std::string path, Access access) : path_(std::move(path)) {
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(path_ + ": cannot open (" + errno_text() + ")");
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(path_ + ": not a regular file");
  }
  file_size_ = static_cast<std::size_t>(st.st_size);
  if (file_size_ == 0) {
    ::close(fd);
    throw Error(path_ + ": empty file, not a flowtrain shard");
  }
  void* map = ::mmap(nullptr, file_size_, PROT_READ, MAP_PRIVATE, fd, 0);
  if (map == MAP_FAILED) {
    const std::string reason = errno_text();
    ::close(fd);
    throw Error(path_ + ": cannot map (" + reason + ")");
  }
  fd_ = fd;
  data_ = static_cast<const std::uint8_t*>(map);
  if (access == Access::kSequential) ::madvise(map, file_size_, MADV_SEQUENTIAL);

  // From here on, fail() unmaps: the destructor does not run for a throwing constructor.
  const std::string n_bytes = std::to_string(file_size_) + " bytes";
  if (file_size_ < sizeof kShardMagic || std::memcmp(data_, kShardMagic, 4) != 0) {
    fail("not a flowtrain shard (no 'FTPK' magic at the start)");
  }
  if (file_size_ < kShardHeaderSize + kShardFooterSize) {
    fail("truncated: " + n_bytes + ", too small for the header and footer");
  }
  if (const auto v = load<std::uint32_t>(data_ + 4); v != kShardVersion) {
    fail("shard format version " + std::to_string(v) +
         (v < kShardVersion ? " (without checksums)" : "") + ", this build reads version " +
         std::to_string(kShardVersion) + ": re-pack it with this build's `flowtrain pack`");
  }
  const std::uint8_t* footer = data_ + file_size_ - kShardFooterSize;
  if (std::memcmp(footer + 28, kShardMagic, 4) != 0) {
    fail("truncated or unfinished: no footer at the end of its " + n_bytes);
  }
  const auto index_offset = load<std::uint64_t>(footer);
  const auto index_size = load<std::uint64_t>(footer + 8);
  const auto index_checksum = load<std::uint64_t>(footer + 16);
  const std::uint64_t index_end = file_size_ - kShardFooterSize;
  if (index_offset < kShardHeaderSize || index_offset % 8 != 0 || index_offset > index_end ||
      index_size != index_end - index_offset || index_size < 16) {
    fail("corrupt footer: index at offset " + std::to_string(index_offset) + ", size " +
         std::to_string(index_size) + ", in a file of " + n_bytes);
  }

  const std::uint8_t* index = data_ + index_offset;
  if (hash_bytes({index, static_cast<std::size_t>(index_size)}) != index_checksum) {
    fail(
        "damaged index (checksum mismatch): its labels, targets, paths and record places "
        "cannot be trusted; re-pack the shard");
  }
  const auto count = load<std::uint64_t>(index);
  const auto target_count = load<std::uint32_t>(index + 8);
  std::uint64_t rest = index_size - 16;
  const bool fits_entries = count <= rest / kShardRecordEntrySize;
  if (fits_entries) rest -= count * kShardRecordEntrySize;
  const std::uint64_t target_row = std::uint64_t{target_count} * sizeof(float);
  const bool fits_targets = fits_entries && (target_row == 0 || count <= rest / target_row);
  if (!fits_targets) {
    fail("corrupt index: " + std::to_string(count) + " records with " +
         std::to_string(target_count) + " targets do not fit its " + std::to_string(index_size) +
         " bytes");
  }
  rest -= count * target_row;
  count_ = static_cast<std::size_t>(count);
  target_count_ = target_count;
  entries_ = index + 16;
  targets_ = reinterpret_cast<const float*>(entries_ + count * kShardRecordEntrySize);
  strings_ =
      reinterpret_cast<const char*>(entries_ + count * kShardRecordEntrySize + count * target_row);
  const std::uint64_t strings_size = rest;

  for (std::size_t i = 0; i < count_; ++i) {
    const std::uint8_t* e = entries_ + i * kShardRecordEntrySize;
    const auto offset = load<std::uint64_t>(e);
    const auto size = load<std::uint64_t>(e + 8);
    const auto path_offset = load<std::uint64_t>(e + 24);
    const auto path_size = load<std::uint64_t>(e + 32);
    if (offset < kShardHeaderSize || offset > index_offset || size > index_offset - offset) {
      fail("corrupt index: record " + std::to_string(i) + " (offset " + std::to_string(offset) +
           ", size " + std::to_string(size) + ") lies outside the record area");
    }
    if (path_offset > strings_size || path_size > strings_size - path_offset) {
      fail("corrupt index: the path of record " + std::to_string(i) + " lies outside the index");
    }
  }
}

ShardReader::~ShardReader() {
  if (data_ != nullptr) ::munmap(const_cast<std::uint8_t*>(data_), file_size_);
  if (fd_ >= 0) ::close(fd_);
}

void ShardReader::fail(const std::string& what) const {
  ::munmap(const_cast<std::uint8_t*>(data_), file_size_);
  ::close(fd_);
  throw Error(path_ + ": " + what);
}

ShardReader::Record ShardReader::record(std::size_t i) const {
  if (i >= count_) {
    throw Error(path() + ": record " + std::to_string(i) + " out of range (" +
                std::to_string(count_) + " records)");
  }
  // Reading a page truncated away since the mapping was made would raise SIGBUS.
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || static_cast<std::uint64_t>(st.st_size) < file_size_) {
    throw Error(path() + ": truncated to " + std::to_string(st.st_size) + " bytes while in use (" +
                std::to_string(file_size_) + " when opened); a shard must not change while read");
  }
  const std::uint8_t* e = entries_ + i * kShardRecordEntrySize;
  Record r;
  r.bytes = {data_ + load<std::uint64_t>(e), static_cast<std::size_t>(load<std::uint64_t>(e + 8))};
  r.label = load<std::int64_t>(e + 16);
  r.targets = {targets_ + i * target_count_, target_count_};
  r.path = {strings_ + load<std::uint64_t>(e + 24),
            static_cast<std::size_t>(load<std::uint64_t>(e + 32))};
  if (hash_bytes(r.bytes) != load<std::uint64_t>(e + 40)) {
    throw Error(path() + ": record " + std::to_string(i) + " (" + std::string(r.path) +
                ") is damaged (checksum mismatch); re-pack the shard");
  }
  return r;
}

// -------------------------------------------------------------------------------- pack_dataset

PackResult pack_dataset(const std::vector<DatasetEntry>& entries,
                        const std::string& out_path,
                        int max_side,
                        const PackProgress& progress) {
  for (const DatasetEntry& e : entries) {
    if (e.targets.size() != entries.front().targets.size()) {
      throw Error(out_path + ": " + e.path + " has " + std::to_string(e.targets.size()) +
                  " targets, " + entries.front().path + " has " +
                  std::to_string(entries.front().targets.size()) +
                  "; a shard needs the same number for every entry");
    }
  }

  PackResult result;
  ShardWriter writer(out_path);
  std::vector<std::uint8_t> file;
  std::vector<std::uint8_t> reencoded;
  Image image;
  // Checked with the same strict decoder training uses, so a file that jpeg_decode would drop
  // is skipped here (and reported), never packed. Without resizing a 1/8-scale decode suffices.
  DecodeOptions check;
  check.min_side = max_side > 0 ? 0 : 1;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const DatasetEntry& e = entries[i];
    std::string reason;
    std::span<const std::uint8_t> bytes;
    std::span<const std::uint8_t> record;
    if (std::string error = read_file(e.path, file, bytes); !error.empty()) {
      reason = "cannot open (" + error + ")";
    } else {
      const DecodeResult decoded = decode_image(bytes, check, image);
      if (!decoded.ok()) {
        reason = decoded.error;
      } else if (max_side > 0 && std::max(image.width, image.height) > max_side) {
        const double scale = static_cast<double>(max_side) / std::max(image.width, image.height);
        const int w = std::max(1, static_cast<int>(std::lround(image.width * scale)));
        const int h = std::max(1, static_cast<int>(std::lround(image.height * scale)));
        const cv::Mat rgb(image.height, image.width, CV_8UC3, image.pixels.data());
        cv::Mat small;
        cv::resize(rgb, small, cv::Size(w, h), 0, 0, cv::INTER_AREA);
        // The bytes cv::imencode(".jpg", BGR, quality 90) gave here before, without imgcodecs.
        try {
          reencoded = compress_jpeg(small.data, small.cols, small.rows, static_cast<int>(small.step),
                                    TJPF_RGB, TJSAMP_420, 90, TJFLAG_ACCURATEDCT);
          record = reencoded;
          ++result.resized;
        } catch (const Error& failure) {
          reason = std::string("cannot re-encode as JPEG: ") + failure.what();
        }
      } else {
        record = bytes;
      }
    }
    if (!reason.empty()) {
      result.skipped.push_back({e.path, reason});
    } else {
      writer.add(record, e.label, e.targets, e.path);
    }
    if (progress) progress(i + 1, entries.size());
  }
  writer.finish();
  result.written = writer.size();
  return result;
}

}  // namespace flowtrain::data
