#pragma once

#include <optional>
#include <string>
#include <vector>

#include "graph/registry.hpp"
#include "stages/data/dataset.hpp"
#include "stages/data/sample.hpp"

namespace flowtrain::data {

/// Emits the rows of a CSV manifest (`path,label[,target...]`, see read_csv_manifest) for
/// `epochs` epochs, in this rank's order (see EpochOrder). Reads the manifest when constructed
/// and no image file: Sample::encoded stays empty and the decode stage reads `path`.
class CsvManifestSource final : public DatasetSource {
 public:
  explicit CsvManifestSource(const Params& params);
  static StageDoc describe();

  /// Names of the numeric target columns, in Sample::targets order.
  const std::vector<std::string>& target_names() const { return manifest_.target_names; }

 protected:
  Sample make_sample(std::uint64_t index) const override;

 private:
  CsvManifestSource(const Params& params, const SourceOptions& options);

  CsvManifestSource(CsvManifest manifest, const SourceOptions& options);
  CsvManifest manifest_;
};

}  // namespace flowtrain::data
