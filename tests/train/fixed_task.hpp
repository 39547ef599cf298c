#pragma once

// A fixed synthetic classification task for the Trainer tests: 8 images of 16x16 a batch, 3
// classes, the class being the mean intensity's third.

#include <torch/torch.h>

#include <cstdint>

#include "stages/data/batch.hpp"

namespace flowtrain::testing {

// Batch `number` of the task. It seeds the global generator (the data, not the training,
// follows that seed): build the batches before the steps whose random draws must be their own.
inline data::Batch fixed_task_batch(std::uint64_t number) {
  torch::manual_seed(1000 + number);
  data::Batch b;
  b.number = number;
  b.end_position = (number + 1) * 8;
  b.labels = torch::randint(0, 3, {8}, torch::kLong);
  b.images = torch::randn({8, 3, 16, 16}) * 0.1 + b.labels.view({8, 1, 1, 1}).to(torch::kFloat);
  return b;
}

}  // namespace flowtrain::testing
