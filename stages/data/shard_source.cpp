#include "stages/data/shard_source.hpp"

#include "graph/error.hpp"

namespace flowtrain::data {

namespace {

std::unique_ptr<ShardReader> open(const Params& params, const SourceOptions& options) {
  auto reader = std::make_unique<ShardReader>(
      required_path(params, "shard"),
      options.order.shuffle ? ShardReader::Access::kRandom : ShardReader::Access::kSequential);
  if (reader->size() == 0) throw Error(reader->path() + ": shard has no records");
  return reader;
}

}  // namespace

ShardSource::ShardSource(const Params& params) : ShardSource(params, read_source_options(params)) {}

ShardSource::ShardSource(const Params& params, const SourceOptions& options)
    : reader_(open(params, options)), cursor_(options.limited(reader_->size()), options) {}

StageDoc ShardSource::describe() {
  return {
      "Maps a packed shard (.ftpk, made by `flowtrain pack`) and emits its records with their "
      "encoded bytes, per epoch in this rank's shuffled order.",
      source_param_specs(path_param("shard", "packed shard file"))};
}

std::optional<Sample> ShardSource::next() {
  const std::optional<EpochCursor::Position> at = cursor_.next();
  if (!at) return std::nullopt;
  const ShardReader::Record record = reader_->record(at->index);
  Sample sample;
  sample.index = at->index;
  sample.epoch = at->epoch;
  sample.path = reader_->path() + "#" + std::to_string(at->index);
  sample.label = record.label;
  sample.targets.assign(record.targets.begin(), record.targets.end());
  sample.encoded.assign(record.bytes.begin(), record.bytes.end());
  return sample;
}

FLOWTRAIN_REGISTER_STAGE("shard", ShardSource);

}  // namespace flowtrain::data
