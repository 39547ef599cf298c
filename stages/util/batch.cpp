#include "stages/util/batch.hpp"

namespace flowtrain::stages {

BatchStage::BatchStage(const Options& options)
    : size_(static_cast<std::size_t>(options.size)), drop_last_(options.drop_last) {
  batch_.reserve(size_);
}

StageDoc BatchStage::describe() {
  return {"Groups integers into batches of `size`, in sequence order.",
          option_specs<Options>()};
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
