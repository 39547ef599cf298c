// The shard reader: any file is refused with a clear error or read with every record inside
// the mapping.
#include <cstdlib>

#include "stages/data/sources/shard.hpp"
#include "tests/fuzz/fuzz_target.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string& path = flowtrain::fuzz::scratch_file(data, size);
  return flowtrain::fuzz::only_clear_errors([&] {
    const flowtrain::data::ShardReader reader(path);
    std::size_t sum = 0;
    for (std::size_t i = 0; i < reader.size(); ++i) {
      const flowtrain::data::ShardReader::Record r = reader.record(i);
      // Touch the first and last byte of each span, so a record outside the mapping faults.
      if (!r.bytes.empty()) sum += r.bytes.front() + r.bytes.back();
      if (!r.path.empty()) sum += static_cast<unsigned char>(r.path.back());
      for (const float t : r.targets) sum += t > 0;
    }
    if (sum == 1u << 31) std::abort();  // keeps the reads
  });
}
