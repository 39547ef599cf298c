#include "graph/tensorboard.hpp"

#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "graph/error.hpp"

namespace flowtrain {

namespace {

constexpr std::array<std::uint32_t, 256> kCrc32cTable = [] {
  std::array<std::uint32_t, 256> table{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0x82F63B78u ^ (c >> 1) : c >> 1;
    table[i] = c;
  }
  return table;
}();

// TFRecord's mask, so that a CRC of data that holds CRCs stays strong.
std::uint32_t masked_crc(std::string_view bytes) {
  const std::uint32_t crc = crc32c(bytes);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

void put_le(std::string& out, std::uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

// Protocol buffers' wire format, the few pieces an Event needs.
void put_varint(std::string& out, std::uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}
void put_bytes(std::string& out, int field, std::string_view bytes) {
  put_varint(out, static_cast<std::uint64_t>(field) << 3 | 2);
  put_varint(out, bytes.size());
  out.append(bytes);
}
void put_double(std::string& out, int field, double value) {
  put_varint(out, static_cast<std::uint64_t>(field) << 3 | 1);
  std::uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  put_le(out, bits, 8);
}
void put_float(std::string& out, int field, float value) {
  put_varint(out, static_cast<std::uint64_t>(field) << 3 | 5);
  std::uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  put_le(out, bits, 4);
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Event (tensorflow/core/util/event.proto): wall_time = 1, step = 2, file_version = 3,
// summary = 5. Summary: value = 1; Summary.Value: tag = 1, simple_value = 2.
std::string event_head(double wall_time, std::int64_t step) {
  std::string event;
  put_double(event, 1, wall_time);
  if (step != 0) {
    put_varint(event, 2 << 3);
    put_varint(event, static_cast<std::uint64_t>(step));
  }
  return event;
}

}  // namespace

std::uint32_t crc32c(std::string_view bytes) {
  std::uint32_t crc = 0xffffffffu;
  for (const char b : bytes) {
    crc = kCrc32cTable[(crc ^ static_cast<unsigned char>(b)) & 0xff] ^ (crc >> 8);
  }
  return crc ^ 0xffffffffu;
}

std::string tf_record(std::string_view data) {
  std::string length;
  put_le(length, data.size(), 8);
  std::string record = length;
  put_le(record, masked_crc(length), 4);
  record.append(data);
  put_le(record, masked_crc(data), 4);
  return record;
}

EventWriter::EventWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error("cannot create the TensorBoard folder " + dir + ": " + ec.message());
  // The name TensorBoard looks for; N keeps two writers of one process and second apart.
  static std::atomic<int> serial{0};
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  const double wall = now_s();
  path_ = (std::filesystem::path(dir) /
           ("events.out.tfevents." + std::to_string(static_cast<std::int64_t>(wall)) + "." + host +
            "." + std::to_string(::getpid()) + "." + std::to_string(serial++)))
              .string();
  file_ = std::fopen(path_.c_str(), "wb");
  if (!file_) throw Error("cannot create " + path_ + ": " + std::strerror(errno));
  std::string version = event_head(wall, 0);
  put_bytes(version, 3, "brain.Event:2");
  write(version);
  flush();
}

EventWriter::~EventWriter() {
  if (file_) std::fclose(file_);
}

void EventWriter::scalar(const std::string& tag, std::int64_t step, double value) {
  std::string value_message;
  put_bytes(value_message, 1, tag);
  put_float(value_message, 2, static_cast<float>(value));
  std::string summary;
  put_bytes(summary, 1, value_message);
  const double wall = now_s();
  std::string event = event_head(wall, step);
  put_bytes(event, 5, summary);
  std::lock_guard lock(mutex_);
  write(event);
  if (wall - flushed_s_ >= 2) {
    if (std::fflush(file_) != 0) throw Error("cannot write " + path_ + ": " + std::strerror(errno));
    flushed_s_ = wall;
  }
}

void EventWriter::flush() {
  std::lock_guard lock(mutex_);
  if (std::fflush(file_) != 0) throw Error("cannot write " + path_ + ": " + std::strerror(errno));
  flushed_s_ = now_s();
}

void EventWriter::write(const std::string& event) {
  const std::string record = tf_record(event);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size()) {
    throw Error("cannot write " + path_ + ": " + std::strerror(errno));
  }
}

}  // namespace flowtrain
