#pragma once

// The base of the dataset sources (image_folder, csv_manifest, shard): a Source of Samples that
// walks this rank's epochs, resumes, and plans its total.

#include <cstdint>
#include <optional>
#include <string>

#include "graph/stage.hpp"
#include "stages/data/sample.hpp"
#include "stages/data/sources/epoch_order.hpp"

namespace flowtrain::data {

/// `path`, the value of the required path param `name`; throws Error if it was not given.
const std::string& required_path(const std::string& path, const std::string& name);

/// Base of the dataset sources: walks an EpochCursor, supports resume (seek) and plans its
/// total. Subclasses turn a position into a Sample.
class DatasetSource : public Source<Sample>, public SampleOrigin {
 public:
  /// Samples this source emits over the whole run (after a seek: the rest of it).
  std::uint64_t total() const { return cursor_.total() - cursor_.ordinal(); }
  std::optional<std::uint64_t> plan(std::optional<std::uint64_t>) override { return total(); }
  bool seek(std::uint64_t position) override;
  bool seek_shared(std::uint64_t position) override { return cursor_.seek_shared(position); }
  Sample stand_in(const Sample& bad, std::uint32_t attempt) const final;
  std::optional<std::uint64_t> shared_position(std::uint64_t end) const final {
    return cursor_.shared_position(end);
  }

 protected:
  DatasetSource(std::size_t size, const SourcePlan& plan)
      : cursor_(size, plan), size_(size), seed_(plan.order.seed) {}
  /// The sample of dataset index `index` (Sample::index, epoch and position are set after).
  /// Called from the source's thread and, for stand-ins, from decoding workers: must only read.
  virtual Sample make_sample(std::uint64_t index) const = 0;

 private:
  std::optional<Sample> next() final;
  /// Behind a mix, a sample's position is the mix's: where a resumed run starts the mix.
  void mixed_at(Sample& sample, std::uint64_t position) final;
  EpochCursor cursor_;
  std::size_t size_;
  std::uint64_t seed_;
};

}  // namespace flowtrain::data
