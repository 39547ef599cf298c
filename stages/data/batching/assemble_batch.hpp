#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "graph/registry.hpp"
#include "stages/data/batch.hpp"
#include "stages/data/batching/batch_pool.hpp"

namespace flowtrain::data {

/// The params of the `assemble_batch` stage.
struct AssembleBatchOptions {
  std::int64_t batch_size = 64;
  bool drop_last = false;
  template <class Declare>
  void declare(Declare& d) {
    d(batch_size, "batch_size", "rows of a batch: decode_crop's batch_size",
      {.min = 1, .max = 1 << 20});
    d(drop_last, "drop_last",
      "drop the last batch if it is smaller (a run that is stopped always drops its partial "
      "batch: resuming redoes it whole)");
  }
};

/// Emits the batches `decode_crop` filled, in order: a batch leaves when its last row arrives,
/// or, when drops took its last rows, when the next batch begins or the input ends. The rows of
/// a batch that lost samples are moved up to close the gaps (the only copy, and only then).
/// Its `batch_size` must be decode_crop's (it plans the batch count before the run).
class AssembleBatchStage final : public FlatMap<BatchRow, Batch> {
 public:
  using Options = AssembleBatchOptions;
  explicit AssembleBatchStage(const Options& options);
  static StageDoc describe();
  bool requires_order() const override { return true; }
  /// Batches from the expected rows: floor(n / batch_size), or ceil without drop_last.
  std::optional<std::uint64_t> plan(std::optional<std::uint64_t> rows) override;

 protected:
  void process(BatchRow&& row, Emitter<Batch>& out) override;
  void finish(Emitter<Batch>& out) override;

 private:
  std::int64_t batch_size_;
  bool drop_last_;
  BatchFiller batch_;
  std::uint64_t number_ = 0;          // decode_crop's number of the batch being assembled
  std::uint64_t start_position_ = 0;  // source position of its first row, dropped or not
  std::uint64_t last_position_ = 0;   // of the last row added
  const SampleOrigin* origin_ = nullptr;  // its source
};

}  // namespace flowtrain::data
