#include "stages/data/csv_source.hpp"

namespace flowtrain::data {

namespace {

CsvManifest load(const Params& params, const SourceOptions& options) {
  CsvManifest manifest = read_csv_manifest(required_path(params, "manifest"));
  manifest.entries.resize(options.limited(manifest.entries.size()));
  return manifest;
}

}  // namespace

CsvManifestSource::CsvManifestSource(const Params& params)
    : CsvManifestSource(params, read_source_options(params)) {}

CsvManifestSource::CsvManifestSource(const Params& params, const SourceOptions& options)
    : CsvManifestSource(load(params, options), options) {}

CsvManifestSource::CsvManifestSource(CsvManifest manifest, const SourceOptions& options)
    : DatasetSource(manifest.entries.size(), options), manifest_(std::move(manifest)) {}

StageDoc CsvManifestSource::describe() {
  return {
      "Reads a CSV manifest (header path,label[,numeric targets...]; relative paths from the "
      "CSV's folder) and emits its rows for decode, per epoch in this rank's shuffled order.",
      source_param_specs(path_param("manifest", "CSV file with a path,label,... header"))};
}

Sample CsvManifestSource::make_sample(std::uint64_t index) const {
  const DatasetEntry& entry = manifest_.entries[index];
  Sample sample;
  sample.path = entry.path;
  sample.label = entry.label;
  sample.targets = entry.targets;
  return sample;
}

FLOWTRAIN_REGISTER_STAGE("csv_manifest", CsvManifestSource);

}  // namespace flowtrain::data
