// Rotary position embedding of one head vector, half-rotation layout (Llama, Qwen): the pairs
// are (x[i], x[i + dim/2]); arithmetic in fp32, each result rounded once to T.

#pragma once

#include <cstdint>

#include "bf16_lanes.h"
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

#if defined(LMISERVE_BF16_LANES)
// The same for bf16, a vector of pairs at a time (the compiler keeps the loop above scalar for
// 16-bit types).
inline void rotate_half(const c10::BFloat16* x, c10::BFloat16* dst, const c10::BFloat16* cos, const c10::BFloat16* sin,
                        int64_t half) {
  using L = Bf16Lanes;
  const auto* xs = reinterpret_cast<const uint16_t*>(x);
  const auto* cs = reinterpret_cast<const uint16_t*>(cos);
  const auto* ss = reinterpret_cast<const uint16_t*>(sin);
  auto* out = reinterpret_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < half; i += L::kWidth) {
    const int64_t n = half - i;
    const L::V a = L::load(xs + i, n), b = L::load(xs + i + half, n);
    const L::V lo = L::fmsub(a, L::load(cs + i, n), L::mul(b, L::load(ss + i, n)));
    const L::V hi = L::fmadd(b, L::load(cs + i + half, n), L::mul(a, L::load(ss + i + half, n)));
    L::store(out + i, lo, n);
    L::store(out + i + half, hi, n);
  }
}
#endif

}  // namespace lmiserve
