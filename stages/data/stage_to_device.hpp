#pragma once

#include <string>

#include "graph/registry.hpp"
#include "stages/data/batch.hpp"

namespace flowtrain::data {

struct StageToDeviceOptions {
  std::string device = "cpu";
  template <class Declare>
  void declare(Declare& d) {
    d(device, "device",
      "where the model runs: cpu (batches are there already: each passes as is), or cuda[:N] "
      "(an async copy on a side stream, from the pinned buffers of collate or decode_crop with "
      "the same device)");
  }
};

/// Pinned-memory staging, the node between batch assembly and the model: with `device: cuda`
/// (where LibTorch has CUDA) it copies each batch's tensors to the GPU with non_blocking on a
/// stream from the pool, so the copy overlaps the model's work on the default stream, waits for
/// it, and hands the pinned buffer back to its pool at once. Several invocations may copy at
/// once (concurrency = batches in flight). With `device: cpu` a batch passes as is, without a
/// copy: a CPU config may leave the node out. Without CUDA in LibTorch the copy compiles away
/// and `device: cuda` is refused when the stage is built.
class StageToDeviceStage final : public Map<Batch, Batch> {
 public:
  using Options = StageToDeviceOptions;
  explicit StageToDeviceStage(const Options& options);
  static StageDoc describe();

 protected:
  std::optional<Batch> process(Batch&& batch, ItemContext& ctx) override;

 private:
  std::string device_;
};

}  // namespace flowtrain::data
