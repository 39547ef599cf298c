#include "stages/util/batch.hpp"

namespace flowtrain::stages {

BatchStage::BatchStage(const Params& params)
    : size_(static_cast<std::size_t>(params.get_int("size"))),
      drop_last_(params.get_bool("drop_last")) {
  batch_.reserve(size_);
}

StageDoc BatchStage::describe() {
  return {"Groups integers into batches of `size`, in sequence order.",
          {int_param("size", 32, "items per batch", 1, 1 << 20),
           bool_param("drop_last", false, "drop the last batch if it is smaller than `size`")}};
}

void BatchStage::process(std::uint64_t&& value, Emitter<std::vector<std::uint64_t>>& out) {
  batch_.push_back(value);
  if (batch_.size() < size_) return;
  out.emit(std::move(batch_));
  batch_ = {};
  batch_.reserve(size_);
}

void BatchStage::finish(Emitter<std::vector<std::uint64_t>>& out) {
  if (!batch_.empty() && !drop_last_ && !out.stopped()) out.emit(std::move(batch_));
  batch_.clear();
}

FLOWTRAIN_REGISTER_STAGE("batch", BatchStage);

}  // namespace flowtrain::stages
