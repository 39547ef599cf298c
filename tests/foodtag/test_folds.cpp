#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "apps/foodtag/folds.hpp"
#include "graph/error.hpp"

using namespace foodtag;

// 542 photos in 20 groups of uneven sizes, as the food photos are: every photo lands in one
// fold, each group and each fold is split as evenly as the counts allow, and the seed alone
// decides which photo goes where.
TEST_CASE("Foodtag.Folds.StratifiedAndEveryPhotoOnce") {
  std::vector<std::string> groups;
  for (int g = 0; g < 20; ++g) {
    for (int i = 0; i < 3 + (g * 7) % 50; ++i) groups.push_back(std::to_string(g));
  }
  for (const int k : {2, 5, 10}) {
    CAPTURE(k);
    const std::vector<int> fold = assign_folds(groups, k, 1);
    REQUIRE(fold.size() == groups.size());
    std::map<int, int> size;
    std::map<std::string, std::map<int, int>> per_group;
    for (std::size_t i = 0; i < fold.size(); ++i) {
      REQUIRE(fold[i] >= 0);
      REQUIRE(fold[i] < k);
      ++size[fold[i]];
      ++per_group[groups[i]][fold[i]];
    }
    CHECK(size.size() == static_cast<std::size_t>(k));
    const auto [small, large] = std::minmax_element(
        size.begin(), size.end(), [](auto& a, auto& b) { return a.second < b.second; });
    CHECK(large->second - small->second <= 1);
    for (auto& [group, counts] : per_group) {
      int lo = 1 << 30, hi = 0;
      for (int f = 0; f < k; ++f) {
        lo = std::min(lo, counts[f]);
        hi = std::max(hi, counts[f]);
      }
      CHECK(hi - lo <= 1);
    }
  }
  CHECK(assign_folds(groups, 5, 1) == assign_folds(groups, 5, 1));
  CHECK(assign_folds(groups, 5, 1) != assign_folds(groups, 5, 2));
  CHECK_THROWS_WITH_AS(assign_folds(groups, 1, 1), "--folds must be 2 or more, got 1",
                       flowtrain::Error);
  CHECK_THROWS_WITH_AS(assign_folds({"a", "b"}, 3, 1), "--folds 3 is more than the 2 photos",
                       flowtrain::Error);
}
