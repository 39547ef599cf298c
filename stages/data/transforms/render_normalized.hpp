#pragma once

#include "stages/data/sample.hpp"
#include "stages/data/transforms/augment.hpp"
#include "stages/data/transforms/normalizer.hpp"

namespace flowtrain::data {

/// render_view followed by Normalizer, fused: the crop is resized into `resized` (render_view's
/// first step), then one pass reads it, flipped if the view says so, applies brightness,
/// contrast and saturation and writes the normalised channel planes into `chw` (3 x size x
/// size floats: a batch row). It replaces six passes over the image and its uint8 copies.
///
/// The floats are bit-identical to render_view + Normalizer: on a CPU with AVX2 and FMA, where
/// OpenCV runs its AVX2 kernels, each step is the same float operation rounded the same way
/// (test Data.RenderNormalized.BitIdenticalToRenderViewThenNormalizer); elsewhere this calls
/// them.
///
///   render_view_normalized(strip, crop, params, 224, Resample::kAreaFrom2x, normalize,
///                          scratch, batch.data_ptr<float>() + row * 3 * 224 * 224);
void render_view_normalized(const Image& in,
                            const PixelRect& crop,
                            const AugmentParams& params,
                            int size,
                            Resample resample,
                            const Normalizer& normalize,
                            Image& resized,
                            float* chw);

/// Whether render_view_normalized runs its own fused pass on this CPU (AVX2 and FMA).
bool fused_render_available();

}  // namespace flowtrain::data
