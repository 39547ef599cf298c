#pragma once

#include <cstdint>
#include <vector>

#include "graph/registry.hpp"

namespace flowtrain::stages {

/// Groups integers into batches of `size`, in sequence order, so batches are the same whatever
/// the concurrency upstream. The last, smaller batch is kept unless `drop_last`.
class BatchStage final : public FlatMap<std::uint64_t, std::vector<std::uint64_t>> {
 public:
  explicit BatchStage(const Params& params);
  static StageDoc describe();
  bool requires_order() const override { return true; }

 protected:
  void process(std::uint64_t&& value, Emitter<std::vector<std::uint64_t>>& out) override;
  void finish(Emitter<std::vector<std::uint64_t>>& out) override;

 private:
  std::size_t size_;
  bool drop_last_;
  std::vector<std::uint64_t> batch_;
};

}  // namespace flowtrain::stages
