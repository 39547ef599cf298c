#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include "stages/data/batch.hpp"
#include "tests/test_stages.hpp"

namespace flowtrain::testing {

/// The batches that reach a sink, by batch number:
///
///   SeenBatches seen;
///   pipeline.add("sink", seen.sink());
struct SeenBatches {
  std::mutex mutex;
  std::map<std::uint64_t, data::Batch> batches;
  std::unique_ptr<Stage> sink() {
    return std::make_unique<ProbeSink<data::Batch>>([this](data::Batch&& b, ItemContext&) {
      std::lock_guard lock(mutex);
      batches[b.number] = std::move(b);
    });
  }
};

}  // namespace flowtrain::testing
