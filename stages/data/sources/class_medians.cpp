#include "stages/data/sources/class_medians.hpp"

#include <algorithm>

#include "graph/error.hpp"

namespace flowtrain::data {

namespace {

float median_of(std::vector<float>& values) {
  const std::size_t n = values.size();
  std::sort(values.begin(), values.end());
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

}  // namespace

ClassTargetMedians class_target_medians(const CsvManifest& manifest) {
  const std::size_t targets = manifest.target_names.size();
  if (targets == 0 || manifest.entries.empty()) {
    throw Error("class target medians: the manifest has " +
                std::string(targets == 0 ? "no target column" : "no row"));
  }
  std::int64_t classes = 0;
  for (const DatasetEntry& e : manifest.entries) classes = std::max(classes, e.label + 1);
  // [label][target] values; the last slot gathers every row for `overall`.
  std::vector<std::vector<std::vector<float>>> values(
      static_cast<std::size_t>(classes) + 1, std::vector<std::vector<float>>(targets));
  for (const DatasetEntry& e : manifest.entries) {
    for (std::size_t t = 0; t < targets; ++t) {
      if (e.label >= 0) values[static_cast<std::size_t>(e.label)][t].push_back(e.targets[t]);
      values.back()[t].push_back(e.targets[t]);
    }
  }
  ClassTargetMedians out;
  for (std::size_t t = 0; t < targets; ++t) out.overall.push_back(median_of(values.back()[t]));
  for (std::int64_t c = 0; c < classes; ++c) {
    std::vector<std::vector<float>>& of_class = values[static_cast<std::size_t>(c)];
    if (of_class[0].empty()) {
      out.by_class.push_back(out.overall);
      continue;
    }
    std::vector<float> medians;
    for (std::vector<float>& v : of_class) medians.push_back(median_of(v));
    out.by_class.push_back(std::move(medians));
  }
  return out;
}

}  // namespace flowtrain::data
