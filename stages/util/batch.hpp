#pragma once

#include <cstdint>
#include <vector>

#include "graph/registry.hpp"

namespace flowtrain::stages {

/// Groups integers into batches of `size`, in sequence order, so batches are the same whatever
/// the concurrency upstream. The last, smaller batch is kept unless `drop_last`.
struct BatchOptions {
  std::int64_t size = 32;
  bool drop_last = false;
  template <class Declare>
  void declare(Declare& d) {
    d(size, "size", "items per batch", {.min = 1, .max = 1 << 20});
    d(drop_last, "drop_last", "drop the last batch if it is smaller than `size`");
  }
};

class BatchStage final : public FlatMap<std::uint64_t, std::vector<std::uint64_t>> {
 public:
  using Options = BatchOptions;
  explicit BatchStage(const Options& options);
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
