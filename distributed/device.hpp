#pragma once

#include <c10/core/Device.h>

#include <string>

namespace flowtrain::dist {

/// The doc of the `device` param, the same on every stage that has one.
inline constexpr const char* kDeviceDoc =
    "where the stage's tensors live: auto (this rank's GPU where LibTorch has CUDA and one is "
    "visible, else the CPU), cpu, cuda (this rank's GPU) or cuda:N";

/// The device a `device` param names, for this process. The one place that decides it, so every
/// stage of a rank agrees:
///  - cpu: the CPU;
///  - cuda: this rank's GPU, cuda:(LOCAL_RANK modulo the GPUs visible), as torchrun's ranks
///    pick theirs; cuda:N: GPU N;
///  - auto: cuda where LibTorch has CUDA and a GPU is visible (CUDA_VISIBLE_DEVICES= hides
///    them), else cpu.
/// Throws Error (one line: "param 'device': ...") for another value, for cuda on a LibTorch
/// built without CUDA or a machine where no GPU is visible, and for a GPU index past the last.
c10::Device resolve_device(const std::string& device);

/// The number of GPUs this process sees: 0 where LibTorch has no CUDA.
int visible_gpus();

}  // namespace flowtrain::dist
