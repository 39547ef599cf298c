#pragma once

#include <optional>
#include <string>
#include <vector>

#include "graph/registry.hpp"
#include "stages/data/dataset.hpp"
#include "stages/data/sample.hpp"

namespace flowtrain::data {

/// Emits the images of a root/<class>/<image> folder (labels: class folders in sorted order) for
/// `epochs` epochs, in this rank's order (see EpochOrder). Lists the folder when constructed;
/// reads no file: Sample::encoded stays empty and the decode stage reads `path`.
class ImageFolderSource final : public DatasetSource {
 public:
  explicit ImageFolderSource(const Params& params);
  static StageDoc describe();

  /// Class names; classes()[label] is the folder of that label.
  const std::vector<std::string>& classes() const { return folder_.classes; }

 protected:
  Sample make_sample(std::uint64_t index) const override;

 private:
  ImageFolderSource(const Params& params, const SourceOptions& options);
  ImageFolderSource(ImageFolder folder, const SourceOptions& options);

  ImageFolder folder_;
};

}  // namespace flowtrain::data
