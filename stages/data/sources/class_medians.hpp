#pragma once

// An evaluation statistic of a manifest: each class's median target, what a model that knows
// only the class should answer (the baseline a regression head must beat).

#include <cstdint>
#include <vector>

#include "stages/data/sources/listing.hpp"

namespace flowtrain::data {

/// Each class's median of each numeric target in a manifest, the value whose mean absolute
/// error over the class is least: what a model that knows only the class should answer.
struct ClassTargetMedians {
  std::vector<std::vector<float>> by_class;  // [label][target]; a class without rows: `overall`
  std::vector<float> overall;                // [target], over every row
  /// The targets to answer for class `label` (`overall` for a label the manifest never names).
  const std::vector<float>& of(std::int64_t label) const {
    return label >= 0 && static_cast<std::size_t>(label) < by_class.size()
               ? by_class[static_cast<std::size_t>(label)]
               : overall;
  }
};

/// The medians of `manifest`'s targets, per class (labels 0 .. the largest) and over all rows;
/// of an even count, the mean of the two middle values. Rows without a label count only in
/// `overall`. Throws Error if the manifest has no target column or no row.
///   class_target_medians(read_csv_manifest("train.csv")).of(3)[0]   // class 3's median energy
ClassTargetMedians class_target_medians(const CsvManifest& manifest);

}  // namespace flowtrain::data
