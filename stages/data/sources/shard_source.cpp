#include "stages/data/sources/shard_source.hpp"

#include "graph/error.hpp"

namespace flowtrain::data {

namespace {

std::shared_ptr<ShardReader> open(const ShardSourceOptions& options, const SourcePlan& plan) {
  auto reader = std::make_shared<ShardReader>(
      required_path(options.shard, "shard"),
      plan.order.shuffle ? ShardReader::Access::kRandom : ShardReader::Access::kSequential);
  if (reader->size() == 0) throw Error(reader->path() + ": shard has no records");
  return reader;
}

}  // namespace

ShardSource::ShardSource(const Options& options, const BuildContext& context)
    : ShardSource(options, source_plan(options.source, job_placement(context))) {}

ShardSource::ShardSource(const Options& options, const SourcePlan& plan)
    : ShardSource(open(options, plan), plan) {}

ShardSource::ShardSource(std::shared_ptr<ShardReader> reader, const SourcePlan& plan)
    : DatasetSource(plan.limited(reader->size()), plan), reader_(std::move(reader)) {}

StageDoc ShardSource::describe() {
  return {
      "Maps a packed shard (.ftpk, made by `flowtrain pack`) and emits its records with their "
      "encoded bytes, per epoch in this rank's shuffled order.",
      option_specs<Options>()};
}

Sample ShardSource::make_sample(std::uint64_t index) const {
  const ShardReader::Record record = reader_->record(index);
  Sample sample;
  sample.path = reader_->path() + "#" + std::to_string(index);
  sample.label = record.label;
  sample.targets.assign(record.targets.begin(), record.targets.end());
  sample.encoded = {record.bytes, reader_};  // a view into the mapping, which it keeps alive
  return sample;
}

FLOWTRAIN_REGISTER_STAGE("shard", ShardSource);

}  // namespace flowtrain::data
