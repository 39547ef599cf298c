#include "stages/data/decode/jpeg_encode.hpp"

#include <turbojpeg.h>

#include <string>

#include "graph/error.hpp"

namespace flowtrain::data {

std::vector<std::uint8_t> compress_jpeg(const std::uint8_t* pixels,
                                        int width,
                                        int height,
                                        int pitch,
                                        int pixel_format,
                                        int subsampling,
                                        int quality,
                                        int flags) {
  const tjhandle handle = tjInitCompress();
  if (handle == nullptr) {
    throw Error(std::string("cannot create a TurboJPEG compressor: ") + tjGetErrorStr2(nullptr));
  }
  struct Destroy {
    tjhandle handle;
    ~Destroy() { tjDestroy(handle); }
  } destroy{handle};
  unsigned char* out = nullptr;
  unsigned long size = 0;
  if (tjCompress2(handle, pixels, width, pitch, height, pixel_format, &out, &size, subsampling,
                  quality, flags) != 0) {
    const std::string message = tjGetErrorStr2(handle);
    tjFree(out);
    throw Error("cannot encode a " + std::to_string(width) + "x" + std::to_string(height) +
                " JPEG: " + message);
  }
  std::vector<std::uint8_t> bytes(out, out + size);
  tjFree(out);
  return bytes;
}

}  // namespace flowtrain::data
