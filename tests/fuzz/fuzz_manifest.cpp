// The CSV manifest reader (and the CSV parser under it): any text is refused naming
// file:line and the column, or read.
#include "graph/csv.hpp"
#include "stages/data/sources/listing.hpp"
#include "tests/fuzz/fuzz_target.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string& path = flowtrain::fuzz::scratch_file(data, size);
  flowtrain::fuzz::only_clear_errors([&] {
    for (const flowtrain::CsvRow& row : flowtrain::read_csv_file(path)) {
      // Written back and read again, every row is what it was.
      const auto again = flowtrain::parse_csv(flowtrain::csv_line(row.fields), "again");
      if (again.size() != 1 || again.front().fields != row.fields) std::abort();
    }
  });
  return flowtrain::fuzz::only_clear_errors([&] { flowtrain::data::read_csv_manifest(path); });
}
