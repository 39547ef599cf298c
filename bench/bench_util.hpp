#pragma once
// Small helpers the benchmark programs share.

#include <algorithm>
#include <ctime>
#include <fstream>
#include <string>
#include <vector>

namespace flowtrain::bench {

/// The median (the mean of the middle two for an even count); `values` must not be empty.
inline double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
}

/// "Thu Nov 26 2026 07:28:13 UTC": the date a benchmark ran, for its header.
inline std::string now_utc() {
  const std::time_t t = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof buf, "%a %b %d %Y %H:%M:%S UTC", std::gmtime(&t));
  return buf;
}

/// "AMD EPYC, avx512_bf16": the CPU's model name from /proc/cpuinfo and whether it has the
/// AVX-512 bf16 instructions (figures from machines that differ here do not compare).
inline std::string cpu_description() {
  std::ifstream in("/proc/cpuinfo");
  std::string model = "unknown CPU", flags;
  for (std::string line; std::getline(in, line);) {
    const std::size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    if (line.rfind("model name", 0) == 0)
      model = line.substr(line.find_first_not_of(" \t", colon + 1));
    if (line.rfind("flags", 0) == 0) flags = line;
  }
  return model +
         (flags.find(" avx512_bf16") != std::string::npos ? ", avx512_bf16" : ", no avx512_bf16");
}

}  // namespace flowtrain::bench
