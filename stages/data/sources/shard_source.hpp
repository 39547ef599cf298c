#pragma once

#include <memory>
#include <optional>
#include <string>

#include "graph/registry.hpp"
#include "stages/data/sample.hpp"
#include "stages/data/sources/dataset_source.hpp"
#include "stages/data/sources/shard.hpp"

namespace flowtrain::data {

/// The params of the `shard` source.
struct ShardSourceOptions {
  std::string shard;
  SourceOptions source;
  template <class Declare>
  void declare(Declare& d) {
    d(shard, "shard", "packed shard file", {.type = ParamType::kPath});
    source.declare(d);
  }
};

/// Emits the records of a packed shard (see shard.hpp, pack_dataset) for `epochs` epochs, in
/// this rank's order (see EpochOrder). The shard is mapped, not read, and nothing is copied:
/// Sample::encoded views the record in the mapping and keeps the mapping alive. Sample::path is "<shard>#<record>";
/// the path the record was packed from is ShardReader::record(i).path.
class ShardSource final : public DatasetSource {
 public:
  using Options = ShardSourceOptions;
  /// Throws Error if `shard` is not given, not a shard, or has no records.
  /// `context`: the run's services; its job placement says which shard this rank reads.
  explicit ShardSource(const Options& options, const BuildContext& context = {});
  static StageDoc describe();

 protected:
  Sample make_sample(std::uint64_t index) const override;

 private:
  ShardSource(const Options& options, const SourcePlan& plan);

  ShardSource(std::shared_ptr<ShardReader> reader, const SourcePlan& plan);
  std::shared_ptr<const ShardReader> reader_;
};

}  // namespace flowtrain::data
