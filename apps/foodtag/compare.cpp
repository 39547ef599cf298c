#include "apps/foodtag/compare.hpp"

#include <algorithm>
#include <cmath>
#include <map>

#include "graph/csv.hpp"
#include "graph/error.hpp"

namespace foodtag {

using flowtrain::Error;

std::pair<double, double> wilson_interval(std::uint64_t k, std::uint64_t n) {
  if (n == 0) return {0, 1};
  const double z = 1.959964, nn = static_cast<double>(n), p = static_cast<double>(k) / nn;
  const double centre = (p + z * z / (2 * nn)) / (1 + z * z / nn);
  const double half = z / (1 + z * z / nn) * std::sqrt(p * (1 - p) / nn + z * z / (4 * nn * nn));
  return {std::max(0.0, centre - half), std::min(1.0, centre + half)};
}

Predictions read_predictions(const std::string& name, const std::string& path) {
  const std::vector<flowtrain::CsvRow> rows = flowtrain::read_csv_file(path);
  const auto column = [&](const std::string& key) {
    if (!rows.empty()) {
      const auto& header = rows.front().fields;
      const auto it = std::find(header.begin(), header.end(), key);
      if (it != header.end()) return static_cast<std::size_t>(it - header.begin());
    }
    throw Error(path + ": no column '" + key +
                "' in the first line (not the predictions `evaluate` writes?)");
  };
  const std::size_t path_at = column("path"), label_at = column("label"),
                    predicted_at = column("predicted");
  Predictions out{.name = name};
  for (std::size_t i = 1; i < rows.size(); ++i) {
    const auto& fields = rows[i].fields;
    if (fields.size() <= std::max({path_at, label_at, predicted_at})) {
      throw Error(path + ":" + std::to_string(rows[i].line) + ": " +
                  std::to_string(fields.size()) + " fields, fewer than the header's");
    }
    out.paths.push_back(fields[path_at]);
    out.right.push_back(fields[label_at] == fields[predicted_at]);
  }
  return out;
}

namespace {

// P(X <= k) for X ~ Binomial(n, 1/2), in log space (no overflow for any n).
double binomial_half_cdf(std::uint64_t k, std::uint64_t n) {
  double sum = 0;
  const double nn = static_cast<double>(n);
  for (std::uint64_t i = 0; i <= k; ++i) {
    const double ii = static_cast<double>(i);
    sum += std::exp(std::lgamma(nn + 1) - std::lgamma(ii + 1) - std::lgamma(nn - ii + 1) -
                    nn * std::log(2.0));
  }
  return sum;
}

}  // namespace

PairedComparison compare(const Predictions& a, const Predictions& b) {
  std::map<std::string, bool> b_right;
  for (std::size_t i = 0; i < b.paths.size(); ++i) b_right[b.paths[i]] = b.right[i];
  if (a.paths.size() != b.paths.size() || b_right.size() != b.paths.size()) {
    throw Error("cannot compare " + a.name + " and " + b.name + " photo by photo: they predicted " +
                std::to_string(a.paths.size()) + " and " + std::to_string(b.paths.size()) +
                " photos (run `foodtag eval` again for both)");
  }
  PairedComparison c{.a = a.name, .b = b.name, .photos = a.paths.size()};
  for (std::size_t i = 0; i < a.paths.size(); ++i) {
    const auto it = b_right.find(a.paths[i]);
    if (it == b_right.end()) {
      throw Error("cannot compare " + a.name + " and " + b.name + " photo by photo: " +
                  a.paths[i] + " is in " + a.name + "'s predictions only (run `foodtag eval` "
                  "again for both)");
    }
    c.only_a += a.right[i] && !it->second;
    c.only_b += !a.right[i] && it->second;
  }
  const std::uint64_t differ = c.only_a + c.only_b;
  c.p_value = std::min(1.0, 2 * binomial_half_cdf(std::min(c.only_a, c.only_b), differ));
  return c;
}

std::string PairedComparison::text() const {
  const double points = 100.0 * (static_cast<double>(only_a) - static_cast<double>(only_b)) /
                        static_cast<double>(std::max<std::uint64_t>(photos, 1));
  return a + " against " + b + " on the same " + std::to_string(photos) + " photos: " +
         std::to_string(only_a) + " right only for " + a + ", " + std::to_string(only_b) +
         " only for " + b + " (" + flowtrain::csv_number(points, "%+.1f") + " points); p = " +
         flowtrain::csv_number(p_value, "%.2g") + " (exact McNemar): " +
         (p_value < 0.05 ? "a split this uneven is rare by chance (p < 0.05)"
                         : "a split this uneven is common by chance");
}

}  // namespace foodtag
