// The checkpoint reader: any file is refused with a clear error (not a checkpoint, a config
// that does not fit, missing tensors) or loads into a model.
#include "stages/train/files/checkpoint.hpp"
#include "tests/fuzz/fuzz_target.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string& path = flowtrain::fuzz::scratch_file(data, size);
  return flowtrain::fuzz::only_clear_errors([&] {
    const flowtrain::train::Checkpoint checkpoint = flowtrain::train::read_checkpoint(path);
    flowtrain::train::load_model(checkpoint);
  });
}
