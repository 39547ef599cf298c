#pragma once

// How far two models' weights (or gradients) are apart, for the tests that compare a
// partitioned or micro-batched step with the whole model's.

#include <doctest/doctest.h>
#include <torch/nn/module.h>

#include <algorithm>

namespace flowtrain::testing {

// The largest difference between the two modules' parameters (or their gradients), each
// relative to the largest magnitude of the reference's.
inline double relative_difference(torch::nn::Module& a,
                                  torch::nn::Module& reference,
                                  bool gradients = false) {
  const auto pa = a.named_parameters(), pr = reference.named_parameters();
  double worst = 0;
  for (const auto& item : pr) {
    const torch::Tensor r = gradients ? item.value().grad() : item.value();
    const torch::Tensor x = gradients ? pa[item.key()].grad() : pa[item.key()];
    REQUIRE(r.defined());
    REQUIRE(x.defined());
    const double scale = r.abs().max().item<double>();
    if (scale == 0) continue;
    worst = std::max(worst, (x - r).abs().max().item<double>() / scale);
  }
  return worst;
}

}  // namespace flowtrain::testing
