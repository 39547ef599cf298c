#include "stages/data/batching/stage_to_device.hpp"

#include "distributed/device.hpp"

#if FLOWTRAIN_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace flowtrain::data {

namespace {

#if FLOWTRAIN_WITH_CUDA
// A batch's copy in flight on a side stream, and the event recorded after it.
class CudaCopy final : public DeviceCopy {
 public:
  CudaCopy(std::vector<at::Tensor> tensors, const c10::cuda::CUDAStream& stream)
      : tensors_(std::move(tensors)) {
    done_.record(stream);
  }
  ~CudaCopy() override { done_.synchronize(); }
  void wait_on_current_stream() const override {
    const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(done_.device_index());
    done_.block(current);
    // The caching allocator then keeps their memory from the side stream's next copies until
    // the consumer's work on them is done.
    for (const at::Tensor& t : tensors_) t.record_stream(current);
  }

 private:
  mutable at::cuda::CUDAEvent done_;
  std::vector<at::Tensor> tensors_;
};
#endif

}  // namespace

StageToDeviceStage::StageToDeviceStage(const Options& options)
    : device_(dist::resolve_device(options.device)) {}

StageDoc StageToDeviceStage::describe() {
  return {"Pinned-memory staging: copies each batch to the device the model runs on (CUDA: "
          "async, on a side stream, from pinned buffers; the model's stream waits on an event); "
          "on cpu a batch passes as is.",
          option_specs<Options>()};
}

std::optional<Batch> StageToDeviceStage::process(Batch&& batch, ItemContext& /*ctx*/) {
#if FLOWTRAIN_WITH_CUDA
  if (device_.is_cuda()) {
    c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool(false, device_.index());
    c10::cuda::CUDAStreamGuard guard(stream);
    std::vector<at::Tensor> copied;
    for (at::Tensor* t : {&batch.images, &batch.labels, &batch.targets}) {
      if (!t->defined()) continue;
      *t = t->to(device_, /*non_blocking=*/true);
      copied.push_back(*t);
    }
    batch.copy = std::make_shared<CudaCopy>(std::move(copied), stream);
  }
#endif
  return std::move(batch);
}

FLOWTRAIN_REGISTER_STAGE("stage_to_device", StageToDeviceStage);

}  // namespace flowtrain::data
