#include "stages/train/inference/teacher_output_cache.hpp"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "graph/error.hpp"
#include "stages/data/splitmix.hpp"

namespace flowtrain::train {

namespace {

using data::hash_bytes;

constexpr char kMagic[8] = {'F', 'T', 'T', 'C', 'A', 'C', 'H', '1'};
constexpr std::uint32_t kRecordMagic = 0x47435446;  // "FTCG"

// The fixed part of the file header; the fingerprint's text follows it.
struct FileHeader {
  char magic[8];
  std::uint32_t version;
  std::uint32_t text_bytes;
  std::uint64_t teacher;
  std::uint64_t recipe;
  std::uint32_t classes;
  std::uint32_t top_k;
  std::uint32_t regression;
  std::uint32_t dtype;
  std::uint32_t payload_bytes;
  std::uint32_t reserved;
  std::uint64_t checksum;  // hash_bytes of the header (with this field 0) and the text
};
static_assert(sizeof(FileHeader) == 64);

// A record: this header, `entries` x (ViewDigest + payload), then a hash_bytes checksum of both.
struct RecordHeader {
  std::uint32_t magic;
  std::uint32_t entries;
  float forward_s_per_entry;
  std::uint32_t reserved;
};
static_assert(sizeof(RecordHeader) == 16);
constexpr std::size_t kDigestBytes = sizeof(ViewDigest);

std::string errno_text() { return std::strerror(errno); }

std::uint64_t header_checksum(FileHeader header, std::span<const std::uint8_t> text) {
  header.checksum = 0;
  const auto* raw = reinterpret_cast<const std::uint8_t*>(&header);
  return hash_bytes(text, hash_bytes({raw, sizeof header}));
}

std::uint16_t to_bits(float v, EntryFormat::Dtype dtype) {
  return dtype == EntryFormat::Dtype::kFloat16 ? c10::Half(v).x : c10::BFloat16(v).x;
}

float from_bits(std::uint16_t bits, EntryFormat::Dtype dtype) {
  if (dtype == EntryFormat::Dtype::kFloat16) return c10::Half(bits, c10::Half::from_bits());
  return c10::BFloat16(bits, c10::BFloat16::from_bits());
}

void put16(std::uint8_t*& out, std::uint16_t v) {
  std::memcpy(out, &v, 2);
  out += 2;
}

std::uint16_t get16(const std::uint8_t*& in) {
  std::uint16_t v;
  std::memcpy(&v, in, 2);
  in += 2;
  return v;
}

void write_all(int fd,
               const std::uint8_t* data,
               std::size_t bytes,
               std::uint64_t offset,
               const std::string& path) {
  while (bytes > 0) {
    const ssize_t n = ::pwrite(fd, data, bytes, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(path + ": cannot write the teacher cache: " + errno_text());
    }
    data += n;
    bytes -= static_cast<std::size_t>(n);
    offset += static_cast<std::uint64_t>(n);
  }
}

// Reads `bytes` at `offset` of `fd` into `out`; false if the file ends before them.
bool read_at(int fd, std::uint64_t offset, std::uint8_t* out, std::size_t bytes) {
  while (bytes > 0) {
    const ssize_t n = ::pread(fd, out, bytes, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    out += n;
    bytes -= static_cast<std::size_t>(n);
    offset += static_cast<std::uint64_t>(n);
  }
  return true;
}

}  // namespace

std::uint64_t hash_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw Error(path + ": cannot read the teacher file to fingerprint it");
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(in.tellg()));
  in.seekg(0);
  if (!in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()))) {
    throw Error(path + ": cannot read the teacher file to fingerprint it");
  }
  return hash_bytes(bytes);
}

std::size_t EntryFormat::payload_bytes() const {
  const std::size_t logits = top_k == 0 ? 2 * std::size_t{classes} : 6 * std::size_t{top_k} + 2;
  return logits + 2 * std::size_t{regression};
}

void encode_outputs(const EntryFormat& format,
                    const float* logits,
                    const float* regression,
                    std::uint8_t* out) {
  if (format.top_k == 0) {
    for (std::uint32_t c = 0; c < format.classes; ++c) put16(out, to_bits(logits[c], format.dtype));
  } else {
    // The top_k classes, largest first (ties: the lower index), then one value for the rest.
    std::vector<std::uint32_t> order(format.classes);
    std::iota(order.begin(), order.end(), 0u);
    std::partial_sort(order.begin(), order.begin() + format.top_k, order.end(),
                      [&](std::uint32_t a, std::uint32_t b) {
                        return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
                      });
    for (std::uint32_t j = 0; j < format.top_k; ++j) {
      put16(out, to_bits(logits[order[j]], format.dtype));
    }
    for (std::uint32_t j = 0; j < format.top_k; ++j) {
      std::memcpy(out, &order[j], 4);
      out += 4;
    }
    double peak = -INFINITY;
    for (std::uint32_t j = format.top_k; j < format.classes; ++j) {
      peak = std::max(peak, double{logits[order[j]]});
    }
    double sum = 0;
    for (std::uint32_t j = format.top_k; j < format.classes; ++j) {
      sum += std::exp(double{logits[order[j]]} - peak);
    }
    const double rest = peak + std::log(sum / (format.classes - format.top_k));
    put16(out, to_bits(static_cast<float>(rest), format.dtype));
  }
  for (std::uint32_t r = 0; r < format.regression; ++r) {
    put16(out, to_bits(regression[r], format.dtype));
  }
}

void decode_outputs(const EntryFormat& format,
                    const std::uint8_t* in,
                    float* logits,
                    float* regression) {
  if (format.top_k == 0) {
    for (std::uint32_t c = 0; c < format.classes; ++c) {
      logits[c] = from_bits(get16(in), format.dtype);
    }
  } else {
    const std::uint8_t* indices = in + 2 * std::size_t{format.top_k};
    const std::uint8_t* rest_at = indices + 4 * std::size_t{format.top_k};
    const float rest = from_bits(get16(rest_at), format.dtype);
    std::fill(logits, logits + format.classes, rest);
    for (std::uint32_t j = 0; j < format.top_k; ++j) {
      std::uint32_t c;
      std::memcpy(&c, indices + 4 * std::size_t{j}, 4);
      logits[c] = from_bits(get16(in), format.dtype);
    }
    in = rest_at;  // get16 stepped past the rest value
  }
  for (std::uint32_t r = 0; r < format.regression; ++r) {
    regression[r] = from_bits(get16(in), format.dtype);
  }
}

TeacherOutputCache::TeacherOutputCache(Options options) : o_(std::move(options)) { open_file(); }

TeacherOutputCache::~TeacherOutputCache() {
  if (fd_ >= 0) {
    ::fdatasync(fd_);
    ::close(fd_);
  }
}

void TeacherOutputCache::open_file() {
  namespace fs = std::filesystem;
  const fs::path path(o_.path);
  std::error_code ec;
  if (o_.read_only) {
    // A rehearsal's cache: what the file holds, never a change to it (nor a lock on it).
    if (!fs::exists(path)) return;
    fd_ = ::open(o_.path.c_str(), O_RDONLY | O_CLOEXEC);
  } else {
    const fs::path folder = path.parent_path().empty() ? fs::path(".") : path.parent_path();
    fs::create_directories(folder, ec);
    lock_ = std::make_unique<FolderLock>(folder.string(), path.filename().string() + ".lock");
    fd_ = ::open(o_.path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  }
  if (fd_ < 0) throw Error(o_.path + ": cannot open the teacher cache: " + errno_text());
  struct stat st {};
  ::fstat(fd_, &st);
  const auto size = static_cast<std::uint64_t>(st.st_size);

  auto start_afresh = [&](bool replaced) {
    stats_.replaced = replaced;
    if (!o_.read_only && ::ftruncate(fd_, 0) != 0) {
      throw Error(o_.path + ": cannot empty the teacher cache: " + errno_text());
    }
    end_ = 0;
  };
  if (size == 0) return;
  FileHeader header{};
  const bool ours = size >= 8 && ::pread(fd_, &header, sizeof header, 0) >= 8 &&
                    std::memcmp(header.magic, kMagic, sizeof kMagic) == 0;
  if (!ours) {
    if (!o_.replace_on_mismatch) {
      throw Error(o_.path +
                  " is not a flowtrain teacher cache; point `path` at another file, or "
                  "set on_mismatch: replace to overwrite it");
    }
    return start_afresh(true);
  }
  if (size < sizeof header || size < sizeof header + header.text_bytes) {
    stats_.dropped_bytes = size;  // a header torn while it was written: there were no entries
    return start_afresh(false);
  }
  std::vector<std::uint8_t> text(header.text_bytes);
  if (::pread(fd_, text.data(), text.size(), sizeof header) != static_cast<ssize_t>(text.size()) ||
      header_checksum(header, text) != header.checksum) {
    if (!o_.replace_on_mismatch) {
      throw Error(o_.path +
                  ": the teacher cache's header is damaged (checksum); delete the file "
                  "or set on_mismatch: replace");
    }
    return start_afresh(true);
  }
  const EntryFormat format{header.classes, header.top_k, header.regression,
                           static_cast<EntryFormat::Dtype>(header.dtype)};
  const std::string was(text.begin(), text.end());
  std::string problem;
  if (header.teacher != o_.fingerprint.teacher) {
    problem = "was filled by another teacher";
  } else if (header.recipe != o_.fingerprint.recipe) {
    problem = "was filled from views made with other data params";
  } else if (format.dtype != o_.dtype) {
    problem = "stores another dtype";
  } else if (format.top_k != (format.classes <= o_.top_k ? 0 : o_.top_k)) {
    problem = "stores another top_k";
  } else if (header.payload_bytes != format.payload_bytes()) {
    problem = "has entries of another layout";
  }
  if (!problem.empty()) {
    if (!o_.replace_on_mismatch) {
      throw Error(o_.path + " " + problem + " (it holds: " + was +
                  "; this run: " + o_.fingerprint.text +
                  "); point `path` at another file, delete it, or set "
                  "on_mismatch: replace to start it afresh");
    }
    return start_afresh(true);
  }
  format_ = format;
  load_records(sizeof header + header.text_bytes, size);
  if (end_ < size) {
    stats_.dropped_bytes = size - end_;
    if (!o_.read_only && ::ftruncate(fd_, static_cast<off_t>(end_)) != 0) {
      throw Error(o_.path + ": cannot cut the torn end off the teacher cache: " + errno_text());
    }
  }
}

void TeacherOutputCache::load_records(std::uint64_t from, std::uint64_t size) {
  const std::size_t payload = format_->payload_bytes();
  const std::size_t entry_bytes = kDigestBytes + payload;
  std::vector<std::uint8_t> record;
  end_ = from;
  std::uint64_t at = from;
  while (at < size) {
    if (!read_record(at, size, record)) {
      // Torn or damaged: the next whole record after it, if any, and its successors still
      // count, so a flipped byte costs its own record only. None: this is the torn tail.
      const std::optional<std::uint64_t> next = find_record(at + 1, size, record);
      if (!next) break;
      stats_.damaged_bytes += *next - at;
      at = *next;
    }
    RecordHeader header;
    std::memcpy(&header, record.data(), sizeof header);
    for (std::uint32_t i = 0; i < header.entries; ++i) {
      const std::size_t entry_at = sizeof header + i * entry_bytes;
      ViewDigest key;
      std::memcpy(&key, record.data() + entry_at, kDigestBytes);
      const std::span<const std::uint8_t> outputs(record.data() + entry_at + kDigestBytes, payload);
      index_.emplace(key, Stored{nullptr, at + entry_at + kDigestBytes, hash_bytes(outputs)});
    }
    recorded_forward_s_ += double{header.forward_s_per_entry} * header.entries;
    at += record.size();
    end_ = at;
  }
}

bool TeacherOutputCache::read_record(std::uint64_t at,
                                     std::uint64_t size,
                                     std::vector<std::uint8_t>& record) const {
  RecordHeader header;
  if (at + sizeof header + 8 > size ||
      !read_at(fd_, at, reinterpret_cast<std::uint8_t*>(&header), sizeof header) ||
      header.magic != kRecordMagic) {
    return false;
  }
  const std::uint64_t body =
      sizeof header + std::uint64_t{header.entries} * (kDigestBytes + format_->payload_bytes());
  if (at + body + 8 > size) return false;  // torn (the write did not finish), or a bad count
  record.resize(body + 8);
  if (!read_at(fd_, at, record.data(), record.size())) return false;
  std::uint64_t checksum;
  std::memcpy(&checksum, record.data() + body, 8);
  return hash_bytes({record.data(), body}) == checksum;
}

std::optional<std::uint64_t> TeacherOutputCache::find_record(
    std::uint64_t from, std::uint64_t size, std::vector<std::uint8_t>& record) const {
  // A scan for the record magic, each hit confirmed by its record's checksum (a false match
  // would need a 64-bit hash collision).
  std::vector<std::uint8_t> chunk(std::size_t{1} << 16);
  for (std::uint64_t at = from; at + sizeof(RecordHeader) + 8 <= size;) {
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(chunk.size(), size - at));
    if (!read_at(fd_, at, chunk.data(), n)) return std::nullopt;
    for (std::size_t i = 0; i + sizeof kRecordMagic <= n; ++i) {
      if (std::memcmp(chunk.data() + i, &kRecordMagic, sizeof kRecordMagic) == 0 &&
          read_record(at + i, size, record)) {
        return at + i;
      }
    }
    at += n - (sizeof kRecordMagic - 1);  // a magic across the chunk's end is in the next
  }
  return std::nullopt;
}

void TeacherOutputCache::write_header(const EntryFormat& format) {
  FileHeader header{};
  std::memcpy(header.magic, kMagic, sizeof kMagic);
  header.version = 1;
  header.text_bytes = static_cast<std::uint32_t>(o_.fingerprint.text.size());
  header.teacher = o_.fingerprint.teacher;
  header.recipe = o_.fingerprint.recipe;
  header.classes = format.classes;
  header.top_k = format.top_k;
  header.regression = format.regression;
  header.dtype = static_cast<std::uint32_t>(format.dtype);
  header.payload_bytes = static_cast<std::uint32_t>(format.payload_bytes());
  const std::span<const std::uint8_t> text(
      reinterpret_cast<const std::uint8_t*>(o_.fingerprint.text.data()), header.text_bytes);
  header.checksum = header_checksum(header, text);
  std::vector<std::uint8_t> bytes(sizeof header + text.size());
  std::memcpy(bytes.data(), &header, sizeof header);
  std::copy(text.begin(), text.end(), bytes.begin() + sizeof header);
  if (!o_.read_only) write_all(fd_, bytes.data(), bytes.size(), 0, o_.path);
  end_ = bytes.size();
}

std::vector<TeacherOutputCache::Lookup> TeacherOutputCache::lookup(
    std::span<const ViewDigest> keys) {
  std::vector<Lookup> out;
  out.reserve(keys.size());
  std::lock_guard lock(mutex_);
  for (const ViewDigest& key : keys) {
    if (index_.count(key) != 0) {
      out.push_back(Lookup::kHit);
    } else if (pending_.count(key) != 0) {
      out.push_back(Lookup::kWait);
    } else {
      pending_.emplace(key, false);
      out.push_back(Lookup::kCompute);
    }
  }
  return out;
}

void TeacherOutputCache::store(std::span<const ViewDigest> keys,
                               const float* logits,
                               std::uint32_t classes,
                               const float* regression,
                               std::uint32_t regression_outputs,
                               double forward_s) {
  std::lock_guard lock(mutex_);
  if (!format_) {
    const EntryFormat format{classes, classes <= o_.top_k ? 0 : o_.top_k, regression_outputs,
                             o_.dtype};
    write_header(format);
    format_ = format;
  } else if (format_->classes != classes || format_->regression != regression_outputs) {
    throw Error(o_.path + " holds " + std::to_string(format_->classes) + " logits and " +
                std::to_string(format_->regression) + " regression outputs per view, but the " +
                "teacher returned " + std::to_string(classes) + " and " +
                std::to_string(regression_outputs));
  }
  const std::size_t payload = format_->payload_bytes();
  const std::size_t entry_bytes = kDigestBytes + payload;
  const std::size_t body = sizeof(RecordHeader) + keys.size() * entry_bytes;
  std::vector<std::uint8_t>& record = written_.emplace_back(body + 8);
  const float per_entry = keys.empty() ? 0.f : static_cast<float>(forward_s / keys.size());
  const RecordHeader header{kRecordMagic, static_cast<std::uint32_t>(keys.size()), per_entry, 0};
  std::memcpy(record.data(), &header, sizeof header);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    std::uint8_t* at = record.data() + sizeof header + i * entry_bytes;
    std::memcpy(at, &keys[i], kDigestBytes);
    encode_outputs(*format_, logits + i * classes,
                   regression != nullptr ? regression + i * regression_outputs : nullptr,
                   at + kDigestBytes);
  }
  const std::uint64_t checksum = hash_bytes({record.data(), body});
  std::memcpy(record.data() + body, &checksum, 8);
  try {
    if (!o_.read_only) write_all(fd_, record.data(), record.size(), end_, o_.path);
  } catch (...) {
    written_.pop_back();
    for (const ViewDigest& key : keys) pending_[key] = true;  // their waiters fail, not hang
    stored_.notify_all();
    throw;
  }
  end_ += record.size();
  for (std::size_t i = 0; i < keys.size(); ++i) {
    index_.emplace(keys[i],
                   Stored{record.data() + sizeof header + i * entry_bytes + kDigestBytes, 0, 0});
    pending_.erase(keys[i]);
  }
  recorded_forward_s_ += forward_s;
  stored_.notify_all();
}

void TeacherOutputCache::abandon(std::span<const ViewDigest> keys) {
  std::lock_guard lock(mutex_);
  for (const ViewDigest& key : keys) {
    if (auto it = pending_.find(key); it != pending_.end()) it->second = true;
  }
  stored_.notify_all();
}

void TeacherOutputCache::entry(const ViewDigest& key, std::vector<std::uint8_t>& out) {
  std::unique_lock lock(mutex_);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(o_.wait_timeout_s);
  while (true) {
    if (auto it = index_.find(key); it != index_.end()) {
      const Stored stored = it->second;
      const std::size_t bytes = format_->payload_bytes();
      lock.unlock();  // a read of the file needs no lock: its records are never rewritten
      const std::size_t at = out.size();
      out.resize(at + bytes);
      if (stored.memory != nullptr) {
        std::memcpy(out.data() + at, stored.memory, bytes);
      } else if (!read_at(fd_, stored.offset, out.data() + at, bytes) ||
                 hash_bytes({out.data() + at, bytes}) != stored.check) {
        throw Error(o_.path +
                    ": the teacher cache was cut short or rewritten by another process "
                    "while this run used it (the entry at byte " +
                    std::to_string(stored.offset) +
                    " is gone or differs); rerun to recompute what it lost");
      }
      return;
    }
    const auto pending = pending_.find(key);
    if (pending == pending_.end()) {
      throw Error(o_.path + ": a view was asked for that is neither stored nor being computed");
    }
    if (pending->second) {
      throw Error(o_.path + ": the batch that computes a view this batch shares failed");
    }
    if (stored_.wait_until(lock, deadline) == std::cv_status::timeout) {
      throw Error(o_.path + ": waited " + std::to_string(o_.wait_timeout_s) +
                  " s for the teacher outputs of a view an earlier batch computes");
    }
  }
}

std::optional<EntryFormat> TeacherOutputCache::format() const {
  std::lock_guard lock(mutex_);
  return format_;
}

TeacherOutputCache::Stats TeacherOutputCache::stats() const {
  std::lock_guard lock(mutex_);
  Stats s = stats_;
  s.entries = index_.size();
  s.file_bytes = end_;
  s.seconds_per_entry = s.entries > 0 ? recorded_forward_s_ / static_cast<double>(s.entries) : 0;
  return s;
}

}  // namespace flowtrain::train
