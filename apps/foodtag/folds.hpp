#pragma once

// foodtag cv's folds: every prepared photo held out exactly once, each fold a stratified share of
// every food group.

#include <cstdint>
#include <string>
#include <vector>

namespace foodtag {

/// The fold (0 .. folds - 1) each photo is held out in, given each photo's food group in a fixed
/// order (the manifests' rows, sorted by path). Each group's photos are shuffled by an
/// mt19937_64 seeded from `seed` and the group (as prepare's split is), then dealt to the folds
/// in turn, each group starting at the fold where the one before left off: every fold holds
/// floor or ceil of 1/folds of each group, and the folds' sizes differ by at most one. Throws
/// flowtrain::Error for fewer than 2 folds, or more folds than photos.
std::vector<int> assign_folds(const std::vector<std::string>& groups, int folds,
                              std::uint64_t seed);

}  // namespace foodtag
