#pragma once

#include <optional>
#include <string>
#include <vector>

#include "graph/registry.hpp"
#include "stages/data/sample.hpp"
#include "stages/data/sources/dataset_source.hpp"
#include "stages/data/sources/listing.hpp"

namespace flowtrain::data {

/// The params of the `csv_manifest` source.
struct CsvManifestOptions {
  std::string manifest;
  SourceOptions source;
  template <class Declare>
  void declare(Declare& d) {
    d(manifest, "manifest", "CSV file with a path,label,... header", {.type = ParamType::kPath});
    source.declare(d);
  }
};

/// Emits the rows of a CSV manifest (`path,label[,target...]`, see read_csv_manifest) for
/// `epochs` epochs, in this rank's order (see EpochOrder). Reads the manifest when constructed
/// and no image file: Sample::encoded stays empty and the decode stage reads `path`.
class CsvManifestSource final : public DatasetSource {
 public:
  using Options = CsvManifestOptions;
  /// Throws Error if `manifest` is not given or not a valid manifest (read_csv_manifest).
  /// `context`: the run's services; its job placement says which shard this rank reads.
  explicit CsvManifestSource(const Options& options, const BuildContext& context = {});
  static StageDoc describe();

  /// Names of the numeric target columns, in Sample::targets order.
  const std::vector<std::string>& target_names() const { return manifest_.target_names; }

 protected:
  Sample make_sample(std::uint64_t index) const override;

 private:
  CsvManifestSource(const Options& options, const SourcePlan& plan);

  CsvManifestSource(CsvManifest manifest, const SourcePlan& plan);
  CsvManifest manifest_;
};

}  // namespace flowtrain::data
