#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>

#include "apps/foodtag/compare.hpp"
#include "graph/error.hpp"
#include "tests/temp_dir.hpp"

using namespace foodtag;

// The textbook values (Wilson 1927; Newcombe 1998, table I).
TEST_CASE("Foodtag.Compare.WilsonInterval") {
  const auto [low0, high0] = wilson_interval(0, 10);
  CHECK(low0 == doctest::Approx(0).epsilon(1e-9));
  CHECK(high0 == doctest::Approx(0.2775).epsilon(1e-3));
  const auto [low5, high5] = wilson_interval(5, 10);
  CHECK(low5 == doctest::Approx(0.2366).epsilon(1e-3));
  CHECK(high5 == doctest::Approx(0.7634).epsilon(1e-3));
  const auto [low81, high81] = wilson_interval(81, 263);  // Newcombe's 81/263
  CHECK(low81 == doctest::Approx(0.2553).epsilon(1e-3));
  CHECK(high81 == doctest::Approx(0.3662).epsilon(1e-3));
  CHECK(wilson_interval(0, 0) == std::pair<double, double>{0, 1});
}

namespace {
Predictions answers(const std::string& name, const std::string& right) {
  Predictions p{.name = name};
  for (std::size_t i = 0; i < right.size(); ++i) {
    p.paths.push_back("photo" + std::to_string(i) + ".jpeg");
    p.right.push_back(right[i] == '1');
  }
  return p;
}
}  // namespace

// Only the photos one model got and the other missed count; their split against a fair coin
// (scipy.stats.binomtest(5, 14).pvalue = 0.4240, binomtest(0, 10) = 0.001953).
TEST_CASE("Foodtag.Compare.McNemarOnTheDiscordantPhotos") {
  // 9 right only for a, 5 only for b, 3 both, 2 neither.
  const PairedComparison c = compare(answers("student", "1111111110000011100"),
                                     answers("baseline", "0000000001111111100"));
  CHECK(c.photos == 19);
  CHECK(c.only_a == 9);
  CHECK(c.only_b == 5);
  CHECK(c.p_value == doctest::Approx(0.4240).epsilon(1e-3));
  CHECK(c.text() ==
        "student against baseline on the same 19 photos: 9 right only for student, 5 only for "
        "baseline (+21.1 points); p = 0.42 (exact McNemar): a split this uneven is common by "
        "chance");
  const PairedComparison ten = compare(answers("a", "1111111111"), answers("b", "0000000000"));
  CHECK(ten.p_value == doctest::Approx(0.001953).epsilon(1e-3));
  CHECK(ten.text().find("is rare by chance (p < 0.05)") != std::string::npos);
  CHECK(compare(answers("a", "1010"), answers("b", "1010")).p_value == 1);
  // The order of the photos does not matter, only which photo is which.
  Predictions reversed = answers("baseline", "0000000001111111100");
  std::reverse(reversed.paths.begin(), reversed.paths.end());
  std::reverse(reversed.right.begin(), reversed.right.end());
  CHECK(compare(answers("student", "1111111110000011100"), reversed).only_a == 9);
}

TEST_CASE("Foodtag.Compare.DifferentPhotosRefused") {
  CHECK_THROWS_WITH_AS(compare(answers("student", "101"), answers("baseline", "1010")),
                       doctest::Contains("they predicted 3 and 4 photos"), flowtrain::Error);
  Predictions other = answers("baseline", "101");
  other.paths[1] = "elsewhere.jpeg";
  CHECK_THROWS_WITH_AS(compare(answers("student", "101"), other),
                       doctest::Contains("photo1.jpeg is in student's predictions only"),
                       flowtrain::Error);
}

TEST_CASE("Foodtag.Compare.ReadsEvaluatePredictions") {
  flowtrain::testing::TempDir dir;
  std::ofstream(dir / "p.csv") << "index,path,label,predicted,probability,target_0,output_0\n"
                                  "0,a.jpeg,3,3,0.9,10,12\n"
                                  "1,\"b,1.jpeg\",2,5,0.4,20,18\n";
  const Predictions p = read_predictions("teacher", (dir / "p.csv").string());
  CHECK(p.paths == std::vector<std::string>{"a.jpeg", "b,1.jpeg"});
  CHECK(p.right == std::vector<bool>{true, false});
  std::ofstream(dir / "q.csv") << "path,label\na.jpeg,3\n";
  CHECK_THROWS_WITH_AS(read_predictions("teacher", (dir / "q.csv").string()),
                       doctest::Contains("q.csv: no column 'predicted'"), flowtrain::Error);
  std::ofstream(dir / "r.csv") << "index,path,label,predicted\n0,a.jpeg\n";
  CHECK_THROWS_WITH_AS(read_predictions("teacher", (dir / "r.csv").string()),
                       doctest::Contains("r.csv:2: 2 fields"), flowtrain::Error);
}
