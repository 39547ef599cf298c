#include "apps/foodtag/folds.hpp"

#include <map>
#include <random>

#include "graph/error.hpp"
#include "stages/data/sources/epoch_order.hpp"

namespace foodtag {

std::vector<int> assign_folds(const std::vector<std::string>& groups, int folds,
                              std::uint64_t seed) {
  if (folds < 2) throw flowtrain::Error("--folds must be 2 or more, got " + std::to_string(folds));
  if (static_cast<std::size_t>(folds) > groups.size()) {
    throw flowtrain::Error("--folds " + std::to_string(folds) + " is more than the " +
                           std::to_string(groups.size()) + " photos");
  }
  std::map<std::string, std::vector<std::size_t>> members;  // group -> photo indices, in order
  for (std::size_t i = 0; i < groups.size(); ++i) members[groups[i]].push_back(i);
  std::vector<int> fold(groups.size(), 0);
  int next = 0;
  for (auto& [group, photos] : members) {
    std::vector<std::uint32_t> key = {static_cast<std::uint32_t>(seed),
                                      static_cast<std::uint32_t>(seed >> 32)};
    for (const char c : group) key.push_back(static_cast<unsigned char>(c));
    std::seed_seq seq(key.begin(), key.end());
    std::mt19937_64 rng(seq);
    flowtrain::data::portable_shuffle(photos, rng);
    for (const std::size_t i : photos) {
      fold[i] = next;
      next = (next + 1) % folds;
    }
  }
  return fold;
}

}  // namespace foodtag
