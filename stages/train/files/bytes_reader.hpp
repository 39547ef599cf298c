#pragma once

#include <caffe2/serialize/read_adapter_interface.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>

namespace flowtrain::train {

/// A LibTorch archive read from bytes already read and checked (read_checked_archive), not from
/// the file again. The bytes must outlive the reader's use (a load or a PyTorchStreamReader).
class BytesReader final : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit BytesReader(std::span<const std::uint8_t> bytes) : bytes_(bytes) {}
  std::size_t size() const override { return bytes_.size(); }
  std::size_t read(std::uint64_t pos, void* buf, std::size_t n, const char*) const override {
    if (pos >= bytes_.size()) return 0;
    n = std::min<std::size_t>(n, bytes_.size() - pos);
    std::memcpy(buf, bytes_.data() + pos, n);
    return n;
  }

 private:
  std::span<const std::uint8_t> bytes_;
};

}  // namespace flowtrain::train
