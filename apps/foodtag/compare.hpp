#pragma once

// How sure a validation accuracy is, and whether two models differ: from the per-photo
// predictions `evaluate` writes (its `predictions` param). On 112 photos one photo is 0.9
// points, so a difference of a few points may be chance; these say how likely.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace foodtag {

/// The 95% Wilson score interval of a proportion `k` of `n` (0..1; {0, 1} for n = 0).
std::pair<double, double> wilson_interval(std::uint64_t k, std::uint64_t n);

/// One model's answers on the validation photos: whether it was right on each, by path.
struct Predictions {
  std::string name;                 // "student"
  std::vector<std::string> paths;   // in the file's order
  std::vector<bool> right;          // predicted == label
};

/// Reads an `evaluate` predictions CSV (index,path,label,predicted,...). Throws Error naming the
/// file and line.
Predictions read_predictions(const std::string& name, const std::string& path);

/// Two models on the same photos (McNemar's test): the photos only one of them got right decide.
struct PairedComparison {
  std::string a, b;
  std::uint64_t photos = 0, only_a = 0, only_b = 0;
  /// Two-sided exact p-value: the chance of a split at least this uneven of the photos only one
  /// got right, if either were as likely to be the one (1 when none differ).
  double p_value = 1;

  /// "student against baseline on the same 112 photos: 9 right only for student, 5 only for
  /// baseline (+3.6 points); p = 0.42 (exact McNemar): a split this uneven is common by chance"
  std::string text() const;
};

/// Throws Error if the two did not predict the same photos.
PairedComparison compare(const Predictions& a, const Predictions& b);

}  // namespace foodtag
