// Rotary position embedding of one head vector, half-rotation layout (Llama, Qwen): the pairs
// are (x[i], x[i + dim/2]); arithmetic in fp32, each result rounded once to T.

#pragma once

#include <cstdint>

#include "convert.h"

namespace lmiserve {

// dst[i] = x[i] cos[i] - x[i + half] sin[i];  dst[i + half] = x[i + half] cos[i + half] + x[i] sin[i + half].
// dst may be x itself.
template <typename T>
inline void rotate_half(const T* x, T* dst, const T* cos, const T* sin, int64_t half) {
#pragma omp simd
  for (int64_t i = 0; i < half; ++i) {
    const float a = to_f32(x[i]), b = to_f32(x[i + half]);
    dst[i] = from_f32<T>(a * to_f32(cos[i]) - b * to_f32(sin[i]));
    dst[i + half] = from_f32<T>(b * to_f32(cos[i + half]) + a * to_f32(sin[i + half]));
  }
}

}  // namespace lmiserve
