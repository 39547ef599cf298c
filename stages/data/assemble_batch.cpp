#include "stages/data/assemble_batch.hpp"

#include <string>

#include "graph/error.hpp"
#include "stages/data/batch_pool.hpp"

namespace flowtrain::data {

AssembleBatchStage::AssembleBatchStage(const Params& params)
    : batch_size_(params.get_int("batch_size")), drop_last_(params.get_bool("drop_last")) {}

StageDoc AssembleBatchStage::describe() {
  return {"Emits the batches decode_crop filled, in order, once their rows are in.",
          {int_param("batch_size", 64, "rows of a batch: decode_crop's batch_size", 1),
           bool_param("drop_last", false, "drop the last batch if it is smaller")}};
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
  if (buffers_ && row.batch != batch_) emit(out, start_position_ + batch_size_);
  if (!buffers_) {
    buffers_ = std::move(row.buffers);
    batch_ = row.batch;
    start_position_ = row.position - static_cast<std::uint64_t>(row.row);
    views_.reserve(static_cast<std::size_t>(batch_size_));
    paths_.reserve(static_cast<std::size_t>(batch_size_));
  }
  if (row.row != filled_) move_row(*buffers_, row.row, filled_);  // close a gap left by a drop
  views_.push_back(row.view);
  paths_.push_back(std::move(row.path));
  last_position_ = row.position;
  ++filled_;
  if (row.row == batch_size_ - 1) emit(out, start_position_ + batch_size_);
}

void AssembleBatchStage::finish(Emitter<Batch>& out) {
  if (buffers_ && !drop_last_) emit(out, last_position_ + 1);
  buffers_.reset();
  filled_ = 0;
  views_ = {};
  paths_ = {};
}

void AssembleBatchStage::emit(Emitter<Batch>& out, std::uint64_t end_position) {
  Batch batch;
  batch.number = next_number_++;
  batch.end_position = end_position;
  batch.views = std::move(views_);
  batch.paths = std::move(paths_);
  finish_batch(batch, std::move(buffers_), filled_);
  filled_ = 0;
  views_ = {};
  paths_ = {};
  out.emit(std::move(batch));
}

FLOWTRAIN_REGISTER_STAGE("assemble_batch", AssembleBatchStage);

}  // namespace flowtrain::data
