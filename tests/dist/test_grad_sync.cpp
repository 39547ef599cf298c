// GradSync across real processes: ZeRO-2's reduce to each owner against the all-reduce, on the
// same gradients.
#include <doctest/doctest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "distributed/grad_sync.hpp"
#include "distributed/job.hpp"
#include "distributed/world.hpp"
#include "tests/dist/child_ranks.hpp"

namespace flowtrain::testing {

namespace {

// Each rank's gradients of a small MLP on its own inputs, averaged by GradSync over the ranks:
// all-reduced (no owners), or reduced to each parameter's owner (ZeRO-2). Every parameter's
// averaged gradient is returned on every rank for all-reduce, on its owner only for ZeRO-2.
std::vector<torch::Tensor> averaged(torch::nn::Sequential& model,
                                    dist::World& world,
                                    const torch::Tensor& input,
                                    std::vector<int> owners) {
  model->zero_grad();
  dist::GradSync sync(
      *model, world,
      {.first_bucket_bytes = 4000, .bucket_bytes = 12000, .owners = std::move(owners)});
  model->forward(input).pow(2).sum().backward();
  sync.end_backward();
  for (std::size_t b = 0; b < sync.buckets().size(); ++b) sync.complete(b);
  sync.end_step();
  std::vector<torch::Tensor> out;
  for (const torch::Tensor& p : model->parameters()) {
    out.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
  }
  return out;
}

}  // namespace

// Prints, per rank: how many owned elements the two reductions gave bit for bit the same, and
// the largest difference as a share of the bound that reduction order allows: both sum the same
// N addends g_i / N (each rank divides before sending), so each result is within
// gamma(N - 1) * sum |g_i / N| of the exact sum whatever the order (Higham, Accuracy and
// Stability, 4.2), and the two within twice that of each other.
int child_grad_sync() {
  dist::WorldOptions options;
  options.backend = "gloo";
  dist::World* world = dist::World::init(job_placement_from_env(), options);
  const int rank = world->rank();
  const int size = world->size();
  torch::manual_seed(1);
  torch::nn::Sequential model(torch::nn::Linear(24, 64), torch::nn::Tanh(),
                              torch::nn::Linear(64, 32));
  // Inputs of mixed sign and scale per rank, so sums of the ranks' gradients cancel.
  torch::manual_seed(100 + rank);
  const torch::Tensor input = torch::randn({16, 24}) * std::pow(4.0, rank);

  // Each rank's own gradients, gathered: the addends every reduction sums.
  model->zero_grad();
  model->forward(input).pow(2).sum().backward();
  std::vector<torch::Tensor> mine;
  for (const torch::Tensor& p : model->parameters()) mine.push_back(p.grad().reshape({-1}));
  std::vector<std::vector<torch::Tensor>> gathered(1);
  for (int r = 0; r < size; ++r) gathered[0].push_back(torch::empty_like(torch::cat(mine)));
  std::vector<torch::Tensor> flat = {torch::cat(mine)};
  world->group().allgather(gathered, flat)->wait();
  torch::Tensor magnitude = torch::zeros_like(flat[0], torch::kDouble);
  for (const torch::Tensor& g : gathered[0]) {
    magnitude += (g / size).abs().to(torch::kDouble);
  }

  const std::vector<torch::Tensor> all = averaged(model, *world, input, {});
  std::vector<int> owners;
  for (std::size_t k = 0; k < all.size(); ++k) owners.push_back(static_cast<int>(k) % size);
  const std::vector<torch::Tensor> zero2 = averaged(model, *world, input, owners);

  const double u = std::numeric_limits<float>::epsilon() / 2;
  const double gamma = (size - 1) * u / (1 - (size - 1) * u);
  std::int64_t owned = 0, equal = 0, offset = 0;
  double worst_share = 0;
  for (std::size_t k = 0; k < all.size(); ++k) {
    const std::int64_t n = all[k].numel();
    if (owners[k] == rank) {
      const torch::Tensor a = all[k].reshape({-1}).to(torch::kDouble);
      const torch::Tensor b = zero2[k].reshape({-1}).to(torch::kDouble);
      const torch::Tensor bound = 2 * gamma * magnitude.narrow(0, offset, n);
      owned += n;
      equal += (a == b).sum().item<std::int64_t>();
      // 0 where equal; an unequal pair against a zero bound counts as infinitely far.
      const torch::Tensor share = torch::where(a == b, torch::zeros_like(a), (a - b).abs() / bound);
      worst_share = std::max(worst_share, share.max().item<double>());
    } else if (zero2[k].defined()) {
      std::printf("rank %d holds the gradient of parameter %zu, owned by rank %d\n", rank, k,
                  owners[k]);
    }
    offset += n;
  }
  std::printf("rank %d of %d: owned %lld equal %lld worst %.3g of the bound\n", rank, size,
              static_cast<long long>(owned), static_cast<long long>(equal), worst_share);
  std::fflush(stdout);
  dist::World::shutdown();
  return 0;
}

// ZeRO-2 reduces each gradient to its owner where ZeRO-1 all-reduces it; the two sum the same
// addends in Gloo's orders. On two ranks a sum of two has one result, so they agree bit for bit;
// on three they differ at most by what reduction order allows (derived above), on any CPU.
TEST_CASE("Dist.GradSync.ReduceToOwnersAgreesWithAllReduceWithinReductionOrder" *
          doctest::timeout(120)) {
  for (const int size : {2, 3}) {
    CAPTURE(size);
    std::vector<Process> ranks = start_ranks("grad-sync-" + std::to_string(size), "grad_sync", size,
                                             [](int) { return std::vector<std::string>{}; });
    for (int r = 0; r < size; ++r) {
      const Exit e = wait_for(ranks[r], 90);
      INFO(e.output);
      REQUIRE(e.code == 0);
      char line[64];
      std::snprintf(line, sizeof line, "rank %d of %d: owned ", r, size);
      const std::size_t at = e.output.find(line);
      REQUIRE(at != std::string::npos);
      long long owned = 0, equal = 0;
      double worst = 0;
      REQUIRE(std::sscanf(e.output.c_str() + at + std::strlen(line), "%lld equal %lld worst %lf",
                          &owned, &equal, &worst) == 3);
      MESSAGE("rank " << r << " of " << size << ": " << equal << " of " << owned
                      << " elements equal, worst " << worst << " of the bound");
      CHECK(owned > 0);
      CHECK(e.output.find(" holds the gradient of parameter ") == std::string::npos);
      if (size == 2) {
        CHECK(equal == owned);
      } else {
        CHECK(worst <= 1.0);
      }
    }
  }
}

}  // namespace flowtrain::testing
