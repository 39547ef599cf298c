#include "stages/data/sources/image_folder_source.hpp"

#include <string_view>

namespace flowtrain::data {

namespace {

std::vector<std::string> split_extensions(const std::string& text) {
  std::vector<std::string> out;
  std::size_t begin = 0;
  while (begin <= text.size()) {
    const std::size_t end = std::min(text.find(',', begin), text.size());
    std::string_view ext = std::string_view(text).substr(begin, end - begin);
    while (!ext.empty() && ext.front() == ' ') ext.remove_prefix(1);
    while (!ext.empty() && ext.back() == ' ') ext.remove_suffix(1);
    if (!ext.empty()) out.emplace_back(ext);
    begin = end + 1;
  }
  return out;
}

ImageFolder load(const ImageFolderOptions& options, const SourcePlan& plan) {
  ImageFolder folder =
      scan_image_folder(required_path(options.root, "root"), split_extensions(options.extensions));
  folder.entries.resize(plan.limited(folder.entries.size()));
  return folder;
}

}  // namespace

ImageFolderSource::ImageFolderSource(const Options& options, const BuildContext& context)
    : ImageFolderSource(options, source_plan(options.source, job_placement(context))) {}

ImageFolderSource::ImageFolderSource(const Options& options, const SourcePlan& plan)
    : ImageFolderSource(load(options, plan), plan) {}

ImageFolderSource::ImageFolderSource(ImageFolder folder, const SourcePlan& plan)
    : DatasetSource(folder.entries.size(), plan), folder_(std::move(folder)) {}

StageDoc ImageFolderSource::describe() {
  return {
      "Lists a root/<class>/<image> folder (labels: class folders in sorted order) and "
      "emits its files' paths for decode, per epoch in this rank's shuffled order.",
      option_specs<Options>()};
}

Sample ImageFolderSource::make_sample(std::uint64_t index) const {
  const DatasetEntry& entry = folder_.entries[index];
  Sample sample;
  sample.path = entry.path;
  sample.label = entry.label;
  return sample;
}

FLOWTRAIN_REGISTER_STAGE("image_folder", ImageFolderSource);

}  // namespace flowtrain::data
