#include "stages/data/csv_source.hpp"

namespace flowtrain::data {

namespace {

CsvManifest load(const CsvManifestOptions& options, const SourceOptions& source) {
  CsvManifest manifest = read_csv_manifest(required_path(options.manifest, "manifest"));
  manifest.entries.resize(source.limited(manifest.entries.size()));
  return manifest;
}

}  // namespace

CsvManifestSource::CsvManifestSource(const Options& options, const BuildContext& context)
    : CsvManifestSource(options,
                      resolve_source_options(options.source, job_placement(context))) {}

CsvManifestSource::CsvManifestSource(const Options& options, const SourceOptions& source)
    : CsvManifestSource(load(options, source), source) {}

CsvManifestSource::CsvManifestSource(CsvManifest manifest, const SourceOptions& options)
    : DatasetSource(manifest.entries.size(), options), manifest_(std::move(manifest)) {}

StageDoc CsvManifestSource::describe() {
  return {
      "Reads a CSV manifest (header path,label[,numeric targets...]; relative paths from the "
      "CSV's folder) and emits its rows for decode, per epoch in this rank's shuffled order.",
      option_specs<Options>()};
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
