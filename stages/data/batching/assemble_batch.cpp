#include "stages/data/batching/assemble_batch.hpp"

#include <string>

#include "graph/error.hpp"

namespace flowtrain::data {

AssembleBatchStage::AssembleBatchStage(const Options& options)
    : batch_size_(options.batch_size), drop_last_(options.drop_last) {}

StageDoc AssembleBatchStage::describe() {
  return {"Emits the batches decode_crop filled, in order, once their rows are in.",
          option_specs<Options>()};
}

std::optional<std::uint64_t> AssembleBatchStage::plan(std::optional<std::uint64_t> rows) {
  if (!rows) return std::nullopt;
  const auto batch = static_cast<std::uint64_t>(batch_size_);
  return drop_last_ ? *rows / batch : (*rows + batch - 1) / batch;
}

void AssembleBatchStage::process(BatchRow&& row, Emitter<Batch>& out) {
  if (row.batch_size != batch_size_) {
    throw Error("batch_size is " + std::to_string(batch_size_) +
                " but decode_crop fills batches of " + std::to_string(row.batch_size) +
                " rows; give both stages the same batch_size");
  }
  // Drops took the last rows of the batch being assembled: it is complete.
  if (batch_.open() && row.batch != number_) {
    out.emit(batch_.take(start_position_ + batch_size_, origin_));
  }
  if (!batch_.open()) {
    batch_.start(std::move(row.buffers), batch_size_);
    number_ = row.batch;
    start_position_ = row.position - static_cast<std::uint64_t>(row.row);
  }
  const std::int64_t to = batch_.rows();
  if (row.row != to) move_row(batch_.buffers(), row.row, to);  // close a gap left by a drop
  batch_.add(row.view, std::move(row.path));
  last_position_ = row.position;
  origin_ = row.origin;
  if (row.row == batch_size_ - 1) out.emit(batch_.take(start_position_ + batch_size_, origin_));
}

void AssembleBatchStage::finish(Emitter<Batch>& out) {
  if (batch_.open() && !drop_last_ && !out.stopped()) {
    out.emit(batch_.take(last_position_ + 1, origin_));
  }
  batch_.discard();
}

FLOWTRAIN_REGISTER_STAGE("assemble_batch", AssembleBatchStage);

}  // namespace flowtrain::data
