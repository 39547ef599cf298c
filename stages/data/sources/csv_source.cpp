#include "stages/data/sources/csv_source.hpp"

namespace flowtrain::data {

namespace {

CsvManifest load(const CsvManifestOptions& options, const SourcePlan& plan) {
  CsvManifest manifest = read_csv_manifest(required_path(options.manifest, "manifest"));
  manifest.entries.resize(plan.limited(manifest.entries.size()));
  return manifest;
}

}  // namespace

CsvManifestSource::CsvManifestSource(const Options& options, const BuildContext& context)
    : CsvManifestSource(options, source_plan(options.source, job_placement(context))) {}

CsvManifestSource::CsvManifestSource(const Options& options, const SourcePlan& plan)
    : CsvManifestSource(load(options, plan), plan) {}

CsvManifestSource::CsvManifestSource(CsvManifest manifest, const SourcePlan& plan)
    : DatasetSource(manifest.entries.size(), plan), manifest_(std::move(manifest)) {}

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
