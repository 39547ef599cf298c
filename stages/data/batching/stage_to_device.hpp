#pragma once

#include <c10/core/Device.h>

#include <string>

#include "graph/registry.hpp"
#include "stages/data/batch.hpp"

namespace flowtrain::data {

struct StageToDeviceOptions {
  std::string device = "auto";
  template <class Declare>
  void declare(Declare& d) {
    d(device, "device",
      "where the model runs (auto, cpu, cuda, cuda:N): on cpu batches are there already and "
      "each passes as is; on a GPU, an async copy on a side stream, from the pinned buffers of "
      "collate or decode_crop");
  }
};

/// Pinned-memory staging, the node between batch assembly and the model: on a GPU it copies
/// each batch's tensors there with non_blocking on a stream from the pool, so the copy overlaps
/// the model's work on its own stream, and hands the batch on at once with an event recorded
/// after the copy (Batch::copy): the model stage's stream waits on it, the host never does.
/// The pinned buffer goes back to its pool when the batch is destroyed. Several invocations may
/// copy at once (concurrency = batches in flight). On cpu a batch passes as is, without a copy:
/// a CPU config may leave the node out. Without CUDA in LibTorch the copy compiles away and a
/// cuda device is refused when the stage is built.
class StageToDeviceStage final : public Map<Batch, Batch> {
 public:
  using Options = StageToDeviceOptions;
  explicit StageToDeviceStage(const Options& options);
  static StageDoc describe();

 protected:
  std::optional<Batch> process(Batch&& batch, ItemContext& ctx) override;

 private:
  c10::Device device_;
};

}  // namespace flowtrain::data
