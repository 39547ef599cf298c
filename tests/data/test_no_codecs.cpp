// What a build without OpenCV's imgcodecs (FLOWTRAIN_IMAGE_CODECS=OFF, or not found) does with
// images: JPEGs decode as in every build, other formats are refused with a reason that says why.
// Built only there; the tests of other formats (test_decode.cpp...) need imgcodecs.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "stages/data/decode/image_decode.hpp"
#include "stages/data/sources/synthetic.hpp"

using namespace flowtrain::data;
using Bytes = std::vector<std::uint8_t>;

#ifdef FLOWTRAIN_WITH_IMGCODECS
#error "test_no_codecs.cpp is for builds without OpenCV imgcodecs"
#endif

TEST_CASE("Data.NoCodecs.JpegsStillDecode") {
  const Image rgb = render_synthetic_image(3, 10, 72, 48, 1, 0);
  for (const Bytes& jpeg : {encode_jpeg(rgb, 90), encode_gray_jpeg(rgb, 90)}) {
    Image image;
    const DecodeResult r = decode_image(jpeg, {}, image);
    REQUIRE(r.ok());
    CHECK(image.width == 72);
    CHECK(image.height == 48);
    CHECK(image.channels == 3);
  }
}

TEST_CASE("Data.NoCodecs.OtherFormatsRefusedSayingWhy") {
  // A PNG's signature and IHDR chunk (64x32, 8-bit RGB): sniffed as PNG, never decoded.
  const Bytes png = {0x89, 'P',  'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A, 0, 0, 0, 13, 'I', 'H', 'D', 'R',
                     0,    0,    0,   64,  0,    0,    0,    32,   8, 2, 0, 0,  0,   0,   0,   0};
  Image image;
  CHECK(decode_image(png, {}, image).error ==
        "cannot decode PNG data: this build has no OpenCV image codecs (JPEG only)");
  CHECK(decode_image(png, {.other_formats = false}, image).error ==
        "not a JPEG (PNG data) and other_formats is false");
  const Bytes text = {'h', 'e', 'l', 'l', 'o'};
  CHECK(decode_image(text, {}, image).error == "not an image (unknown format)");
}
