#pragma once

#include <optional>
#include <string>
#include <vector>

#include "graph/registry.hpp"
#include "stages/data/sample.hpp"
#include "stages/data/sources/dataset_source.hpp"
#include "stages/data/sources/listing.hpp"

namespace flowtrain::data {

/// The params of the `image_folder` source.
struct ImageFolderOptions {
  std::string root;
  SourceOptions source;
  std::string extensions = "jpg,jpeg";
  template <class Declare>
  void declare(Declare& d) {
    d(root, "root", "folder with one subfolder per class", {.type = ParamType::kPath});
    source.declare(d);
    d(extensions, "extensions", "comma-separated file extensions to take (case-insensitive)");
  }
};

/// Emits the images of a root/<class>/<image> folder (labels: class folders in sorted order) for
/// `epochs` epochs, in this rank's order (see EpochOrder). Lists the folder when constructed;
/// reads no file: Sample::encoded stays empty and the decode stage reads `path`.
class ImageFolderSource final : public DatasetSource {
 public:
  using Options = ImageFolderOptions;
  /// Throws Error if `root` is not given or holds no image (scan_image_folder).
  /// `context`: the run's services; its job placement says which shard this rank reads.
  explicit ImageFolderSource(const Options& options, const BuildContext& context = {});
  static StageDoc describe();

  /// Class names; classes()[label] is the folder of that label.
  const std::vector<std::string>& classes() const { return folder_.classes; }

 protected:
  Sample make_sample(std::uint64_t index) const override;

 private:
  ImageFolderSource(const Options& options, const SourcePlan& plan);
  ImageFolderSource(ImageFolder folder, const SourcePlan& plan);

  ImageFolder folder_;
};

}  // namespace flowtrain::data
