#include "distributed/device.hpp"

#include <torch/cuda.h>

#include "distributed/job.hpp"
#include "graph/error.hpp"

namespace flowtrain::dist {

int visible_gpus() { return static_cast<int>(torch::cuda::device_count()); }

c10::Device resolve_device(const std::string& device) {
  // cuda:N: N in decimal digits (at most 4).
  const std::string index = device.rfind("cuda:", 0) == 0 ? device.substr(5) : "";
  const bool indexed = !index.empty() && index.size() <= 4 &&
                       index.find_first_not_of("0123456789") == std::string::npos;
  if (device != "cpu" && device != "auto" && device != "cuda" && !indexed) {
    throw Error("param 'device' must be auto, cpu, cuda or cuda:N, got '" + device + "'");
  }
  if (device == "cpu") return c10::Device(c10::DeviceType::CPU);
  const int gpus = visible_gpus();
  if (gpus == 0) {
    if (device == "auto") return c10::Device(c10::DeviceType::CPU);
#ifdef FLOWTRAIN_WITH_CUDA
    throw Error("param 'device': '" + device +
                "' but no GPU is visible to this process (CUDA_VISIBLE_DEVICES, the driver); "
                "use cpu or auto");
#else
    throw Error("param 'device': '" + device +
                "' needs a LibTorch built with CUDA, and this flowtrain was built against a "
                "CPU-only one (docs/gpu.md); use cpu or auto");
#endif
  }
  const int gpu = indexed ? std::stoi(index) : job_placement_from_env().local_rank % gpus;
  if (gpu >= gpus) {
    throw Error("param 'device': '" + device + "' but this process sees " + std::to_string(gpus) +
                " GPU(s), cuda:0 to cuda:" + std::to_string(gpus - 1));
  }
  return c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(gpu));
}

}  // namespace flowtrain::dist
