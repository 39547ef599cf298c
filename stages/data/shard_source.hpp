#pragma once

#include <memory>
#include <optional>
#include <string>

#include "graph/registry.hpp"
#include "stages/data/dataset.hpp"
#include "stages/data/sample.hpp"
#include "stages/data/shard.hpp"

namespace flowtrain::data {

/// Emits the records of a packed shard (see shard.hpp, pack_dataset) for `epochs` epochs, in
/// this rank's order (see EpochOrder). The shard is mapped, not read: each sample copies its
/// record's bytes into Sample::encoded when it is emitted. Sample::path is "<shard>#<record>";
/// the path the record was packed from is ShardReader::record(i).path.
class ShardSource final : public Source<Sample> {
 public:
  explicit ShardSource(const Params& params);
  static StageDoc describe();

  /// Samples this source emits over the whole run.
  std::uint64_t total() const { return cursor_.total(); }

 protected:
  std::optional<Sample> next() override;

 private:
  ShardSource(const Params& params, const SourceOptions& options);

  std::unique_ptr<ShardReader> reader_;
  EpochCursor cursor_;
};

}  // namespace flowtrain::data
