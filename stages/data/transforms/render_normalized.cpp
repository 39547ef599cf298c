#include "stages/data/transforms/render_normalized.hpp"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define FLOWTRAIN_FUSED_RENDER 1
#endif

namespace flowtrain::data {

#ifdef FLOWTRAIN_FUSED_RENDER

namespace {

#define FLOWTRAIN_AVX2 __attribute__((target("avx2,fma")))

FLOWTRAIN_AVX2 inline __m256i sad3(__m256i a, __m256i b, __m256i c) {
  const __m256i zero = _mm256_setzero_si256();
  return _mm256_add_epi64(_mm256_sad_epu8(a, zero),
                          _mm256_add_epi64(_mm256_sad_epu8(b, zero), _mm256_sad_epu8(c, zero)));
}

FLOWTRAIN_AVX2 inline std::uint64_t lane_total(__m256i v) {
  alignas(32) std::uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), v);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

/// Exact per-channel sums of `n` interleaved RGB bytes (what cv::mean adds up).
FLOWTRAIN_AVX2 void channel_sums(const std::uint8_t* px, std::size_t n, std::uint64_t sums[3]) {
  // 96 bytes are 32 whole pixels in three vectors; byte i of vector k is channel (32k + i) % 3.
  // Summing all bytes, and those of channels 0 and 1 through masks, gives channel 2 too.
  alignas(32) std::uint8_t masks[3][2][32];
  for (int k = 0; k < 3; ++k) {
    for (int c = 0; c < 2; ++c) {
      for (int i = 0; i < 32; ++i) masks[k][c][i] = (32 * k + i) % 3 == c ? 0xFF : 0;
    }
  }
  __m256i m[3][2];
  for (int k = 0; k < 3; ++k) {
    for (int c = 0; c < 2; ++c) {
      m[k][c] = _mm256_load_si256(reinterpret_cast<const __m256i*>(masks[k][c]));
    }
  }
  __m256i all = _mm256_setzero_si256(), red = all, green = all;
  std::size_t i = 0;
  for (; i + 96 <= n; i += 96) {
    const auto* v = reinterpret_cast<const __m256i*>(px + i);
    const __m256i v0 = _mm256_loadu_si256(v), v1 = _mm256_loadu_si256(v + 1),
                  v2 = _mm256_loadu_si256(v + 2);
    all = _mm256_add_epi64(all, sad3(v0, v1, v2));
    red = _mm256_add_epi64(red, sad3(_mm256_and_si256(v0, m[0][0]), _mm256_and_si256(v1, m[1][0]),
                                     _mm256_and_si256(v2, m[2][0])));
    green = _mm256_add_epi64(green, sad3(_mm256_and_si256(v0, m[0][1]),
                                         _mm256_and_si256(v1, m[1][1]),
                                         _mm256_and_si256(v2, m[2][1])));
  }
  sums[0] = lane_total(red);
  sums[1] = lane_total(green);
  sums[2] = lane_total(all) - sums[0] - sums[1];
  for (; i < n; ++i) sums[i % 3] += px[i];
}

/// The constants of one view's pass.
struct PassConstants {
  __m256 alpha, beta;          // brightness and contrast: convertTo's scale and shift
  __m256 saturation, keep;     // addWeighted's weights of the pixel and of its grey level
  __m256 scale[3], bias[3];    // Normalizer's
  __m128i low[3], high[3];     // shuffles that gather a channel of 8 pixels (reversed: flip)
};

/// Shuffles gathering channel c of 8 RGB pixels from bytes 0-15 (`low`) and 8-23 (`high`) of
/// their 24, in reverse order for a flipped row.
void gather_shuffles(bool reverse, PassConstants& k) {
  for (int c = 0; c < 3; ++c) {
    alignas(16) std::int8_t low[16], high[16];
    for (int j = 0; j < 16; ++j) {
      low[j] = high[j] = -128;  // zero
      if (j >= 8) continue;
      const int offset = 3 * (reverse ? 7 - j : j) + c;
      if (offset < 16) {
        low[j] = static_cast<std::int8_t>(offset);
      } else {
        high[j] = static_cast<std::int8_t>(offset - 8);
      }
    }
    std::memcpy(&k.low[c], low, 16);
    std::memcpy(&k.high[c], high, 16);
  }
}

/// saturate_cast<uchar> of OpenCV's SIMD paths: round half to even, then clamp to [0, 255].
FLOWTRAIN_AVX2 inline __m256 round_to_u8(__m256 x) {
  const __m256 r = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return _mm256_min_ps(_mm256_max_ps(r, _mm256_setzero_ps()), _mm256_set1_ps(255));
}

FLOWTRAIN_AVX2 inline __m256 gather_channel(__m128i low, __m128i high, const PassConstants& k,
                                            int c) {
  const __m128i bytes =
      _mm_or_si128(_mm_shuffle_epi8(low, k.low[c]), _mm_shuffle_epi8(high, k.high[c]));
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
}

/// The pass, 8 pixels at a time; a row whose width is not a multiple of 8 ends with the last 8
/// pixels again (the same values written twice).
template <bool kLinear, bool kSaturate>
FLOWTRAIN_AVX2 void fused_pass(const std::uint8_t* px,
                               int size,
                               bool flip,
                               const PassConstants& k,
                               float* chw) {
  // cvtColor's RGB2GRAY: (R * 9798 + G * 19235 + B * 3735 + 2^14) >> 15, exact in float.
  const __m256 to_grey_r = _mm256_set1_ps(9798), to_grey_g = _mm256_set1_ps(19235),
               to_grey_b = _mm256_set1_ps(3735), half = _mm256_set1_ps(16384),
               shift = _mm256_set1_ps(1.0f / 32768);
  const std::size_t plane = static_cast<std::size_t>(size) * size;
  for (int y = 0; y < size; ++y) {
    const std::uint8_t* row = px + static_cast<std::size_t>(y) * size * 3;
    float* out = chw + static_cast<std::size_t>(y) * size;
    for (int x = 0; x < size; x += 8) {
      if (x > size - 8) x = size - 8;
      const std::uint8_t* pixels = row + 3 * (flip ? size - 8 - x : x);
      const __m128i low = _mm_loadu_si128(reinterpret_cast<const __m128i*>(pixels));
      const __m128i high = _mm_loadu_si128(reinterpret_cast<const __m128i*>(pixels + 8));
      __m256 r = gather_channel(low, high, k, 0);
      __m256 g = gather_channel(low, high, k, 1);
      __m256 b = gather_channel(low, high, k, 2);
      if constexpr (kLinear) {  // convertTo(dst, -1, alpha, beta)
        r = round_to_u8(_mm256_fmadd_ps(r, k.alpha, k.beta));
        g = round_to_u8(_mm256_fmadd_ps(g, k.alpha, k.beta));
        b = round_to_u8(_mm256_fmadd_ps(b, k.alpha, k.beta));
      }
      if constexpr (kSaturate) {  // addWeighted(dst, s, grey, 1 - s, 0)
        __m256 grey = _mm256_fmadd_ps(
            r, to_grey_r, _mm256_fmadd_ps(g, to_grey_g, _mm256_fmadd_ps(b, to_grey_b, half)));
        grey = _mm256_floor_ps(_mm256_mul_ps(grey, shift));
        const __m256 kept = _mm256_mul_ps(grey, k.keep);
        r = round_to_u8(_mm256_fmadd_ps(r, k.saturation, kept));
        g = round_to_u8(_mm256_fmadd_ps(g, k.saturation, kept));
        b = round_to_u8(_mm256_fmadd_ps(b, k.saturation, kept));
      }
      _mm256_storeu_ps(out + x, _mm256_fmadd_ps(r, k.scale[0], k.bias[0]));
      _mm256_storeu_ps(out + plane + x, _mm256_fmadd_ps(g, k.scale[1], k.bias[1]));
      _mm256_storeu_ps(out + 2 * plane + x, _mm256_fmadd_ps(b, k.scale[2], k.bias[2]));
    }
  }
}

/// render_view's float constants, computed as it computes them, then the pass.
FLOWTRAIN_AVX2 void fused_render(const Image& view,
                                 const AugmentParams& p,
                                 const Normalizer& normalize,
                                 float* chw) {
  const int size = view.width;
  const bool linear = p.brightness != 1 || p.contrast != 1;
  const bool saturate = p.saturation != 1;
  PassConstants k;
  float alpha = 1, beta = 0;
  if (linear) {
    const std::size_t pixels = static_cast<std::size_t>(size) * size;
    std::uint64_t sums[3] = {0, 0, 0};
    channel_sums(view.pixels.data(), 3 * pixels, sums);
    const double per_pixel = 1.0 / static_cast<double>(pixels);  // cv::mean: sum * (1. / n)
    const double mean[3] = {static_cast<double>(sums[0]) * per_pixel,
                            static_cast<double>(sums[1]) * per_pixel,
                            static_cast<double>(sums[2]) * per_pixel};
    const ContrastMap map = contrast_map(p, mean);
    alpha = static_cast<float>(map.alpha);  // convertTo's kernel takes them as float
    beta = static_cast<float>(map.beta);
  }
  k.alpha = _mm256_set1_ps(alpha);
  k.beta = _mm256_set1_ps(beta);
  k.saturation = _mm256_set1_ps(p.saturation);
  k.keep = _mm256_set1_ps(static_cast<float>(1.0 - static_cast<double>(p.saturation)));
  for (int c = 0; c < 3; ++c) {
    k.scale[c] = _mm256_set1_ps(normalize.scale(c));
    k.bias[c] = _mm256_set1_ps(normalize.bias(c));
  }
  gather_shuffles(p.flip, k);
  const std::uint8_t* px = view.pixels.data();
  if (linear && saturate) {
    fused_pass<true, true>(px, size, p.flip, k, chw);
  } else if (linear) {
    fused_pass<true, false>(px, size, p.flip, k, chw);
  } else if (saturate) {
    fused_pass<false, true>(px, size, p.flip, k, chw);
  } else {
    fused_pass<false, false>(px, size, p.flip, k, chw);
  }
}

}  // namespace

bool fused_render_available() {
  static const bool available = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return available;
}

#else

bool fused_render_available() { return false; }

#endif

void render_view_normalized(const Image& in,
                            const PixelRect& crop,
                            const AugmentParams& params,
                            int size,
                            Resample resample,
                            const Normalizer& normalize,
                            Image& resized,
                            float* chw) {
#ifdef FLOWTRAIN_FUSED_RENDER
  if (size >= 8 && fused_render_available()) {
    resize_view(in, crop, size, resized, resample);
    fused_render(resized, params, normalize, chw);
    return;
  }
#endif
  render_view(in, crop, params, size, resized, resample);
  normalize(resized, chw);
}

}  // namespace flowtrain::data
