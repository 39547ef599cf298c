// The `device` param as every stage reads it: one place decides it per rank.
#include <doctest/doctest.h>

#include <cstdlib>
#include <string>

#include "distributed/device.hpp"
#include "graph/error.hpp"

using namespace flowtrain;

TEST_CASE("Dist.Device.CpuAndAutoOnAMachineWithoutGpu") {
  CHECK(dist::resolve_device("cpu") == c10::Device(c10::DeviceType::CPU));
  if (dist::visible_gpus() == 0) {
    CHECK(dist::resolve_device("auto") == c10::Device(c10::DeviceType::CPU));
  } else {
    CHECK(dist::resolve_device("auto").is_cuda());
  }
}

TEST_CASE("Dist.Device.CudaWithoutAGpuIsRefusedInOneLine") {
  if (dist::visible_gpus() > 0) return;  // the machine has one: nothing to refuse
  for (const std::string device : {"cuda", "cuda:0"}) {
    try {
      dist::resolve_device(device);
      FAIL("resolve_device('" << device << "') did not throw");
    } catch (const Error& e) {
      const std::string what = e.what();
      CHECK(what.rfind("param 'device': '" + device + "' ", 0) == 0);
      CHECK(what.find("use cpu or auto") != std::string::npos);
      CHECK(what.find('\n') == std::string::npos);
    }
  }
}

TEST_CASE("Dist.Device.NamesTheChoicesForAnythingElse") {
  for (const char* device : {"tpu", "gpu", "cuda:", "cuda:x", "cuda:-1", "CPU", ""}) {
    CHECK_THROWS_WITH_AS(dist::resolve_device(device),
                         ("param 'device' must be auto, cpu, cuda or cuda:N, got '" +
                          std::string(device) + "'")
                             .c_str(),
                         Error);
  }
}

TEST_CASE("Dist.Device.AGpuPastTheLastIsRefused") {
  const int gpus = dist::visible_gpus();
  if (gpus == 0) return;  // refused above for having none
  CHECK_THROWS_WITH_AS(dist::resolve_device("cuda:" + std::to_string(gpus)),
                       doctest::Contains("GPU(s), cuda:0 to cuda:"), Error);
  // cuda: the local rank's GPU, as torchrun's ranks pick theirs.
  ::setenv("LOCAL_RANK", "1", 1);
  ::setenv("WORLD_SIZE", "2", 1);
  ::setenv("RANK", "1", 1);
  CHECK(dist::resolve_device("cuda").index() == 1 % gpus);
  ::unsetenv("LOCAL_RANK");
  ::unsetenv("WORLD_SIZE");
  ::unsetenv("RANK");
}
