#include "stages/data/stage_to_device.hpp"

#include "stages/data/batch_pool.hpp"

#if FLOWTRAIN_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace flowtrain::data {

StageToDeviceStage::StageToDeviceStage(const Options& options) : device_(options.device) {
  check_device(device_);
}

StageDoc StageToDeviceStage::describe() {
  return {"Pinned-memory staging: copies each batch to the device the model runs on (CUDA: "
          "async, on a side stream, from pinned buffers); on cpu a batch passes as is.",
          option_specs<Options>()};
}

std::optional<Batch> StageToDeviceStage::process(Batch&& batch, ItemContext& /*ctx*/) {
#if FLOWTRAIN_WITH_CUDA
  if (wants_cuda(device_)) {
    const at::Device device(device_);
    c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool(false, device.index());
    c10::cuda::CUDAStreamGuard guard(stream);
    batch.images = batch.images.to(device, /*non_blocking=*/true);
    batch.labels = batch.labels.to(device, /*non_blocking=*/true);
    batch.targets = batch.targets.to(device, /*non_blocking=*/true);
    stream.synchronize();
    batch.lease.reset();  // the pinned buffer goes back to its pool
  }
#endif
  return std::move(batch);
}

FLOWTRAIN_REGISTER_STAGE("stage_to_device", StageToDeviceStage);

}  // namespace flowtrain::data
