#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "graph/error.hpp"
#include "graph/tensorboard.hpp"
#include "tests/temp_dir.hpp"

using namespace flowtrain;
using flowtrain::testing::TempDir;
namespace fs = std::filesystem;

namespace {

std::uint64_t le(const std::string& bytes, std::size_t at, int n) {
  std::uint64_t value = 0;
  for (int i = n; i-- > 0;) value = value << 8 | static_cast<unsigned char>(bytes[at + i]);
  return value;
}

std::uint32_t masked(std::string_view bytes) {
  const std::uint32_t crc = crc32c(bytes);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

}  // namespace

TEST_CASE("Metrics.TensorBoard.Crc32cIsCastagnolis") {
  // The check values of CRC-32C (RFC 3720, B.4): "123456789", 32 zero bytes, 32 0xff bytes.
  CHECK(crc32c("123456789") == 0xE3069283u);
  CHECK(crc32c(std::string(32, '\0')) == 0x8A9136AAu);
  CHECK(crc32c(std::string(32, '\xff')) == 0x62A8AB43u);
}

TEST_CASE("Metrics.TensorBoard.RecordsFrameTheirDataWithMaskedCrcs") {
  const std::string data = "an event";
  const std::string record = tf_record(data);
  REQUIRE(record.size() == 8 + 4 + data.size() + 4);
  CHECK(le(record, 0, 8) == data.size());
  CHECK(le(record, 8, 4) == masked(record.substr(0, 8)));
  CHECK(record.substr(12, data.size()) == data);
  CHECK(le(record, 12 + data.size(), 4) == masked(data));
}

TEST_CASE("Metrics.TensorBoard.WriterOpensWithTheVersionAndAppendsScalars") {
  TempDir dir("tensorboard");
  std::string path;
  {
    EventWriter events(dir.str("runs/distill"));  // its parents are created
    path = events.path();
    events.scalar("train/loss", 7, 0.5);
  }
  CHECK(fs::path(path).filename().string().rfind("events.out.tfevents.", 0) == 0);
  std::ifstream in(path, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  const std::string file = bytes.str();
  const std::size_t first = le(file, 0, 8);
  CHECK(file.substr(12, first).find("brain.Event:2") != std::string::npos);
  const std::size_t second_at = 16 + first;
  const std::size_t second = le(file, second_at, 8);
  CHECK(file.size() == second_at + 16 + second);
  const std::string event = file.substr(second_at + 12, second);
  CHECK(event.find("train/loss") != std::string::npos);
  float half = 0.5f;
  CHECK(event.find(std::string(reinterpret_cast<const char*>(&half), 4)) != std::string::npos);
  CHECK(event.find(std::string("\x10\x07", 2)) != std::string::npos);  // step 7

  std::ofstream(dir / "a-file") << "x";
  CHECK_THROWS_WITH_AS(EventWriter(dir.str("a-file")),
                       doctest::Contains("cannot create the TensorBoard folder"), Error);
}
