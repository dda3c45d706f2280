// One vector of bf16 values widened to fp32, with the few operations the element-wise kernels
// (norms, rotary, prompt attention's sums, the sampler's row) need, so each kernel is written
// once for AVX-512 (16 lanes) and AVX2 (8 lanes): the fp32 operations of F32x16 or F32x8
// (bf16_vec.h), and bf16 loads and stores, which take a length, so a row's last partial vector
// needs no scalar tail; fp32 ones (load_f32, store_f32) are of whole vectors.

#pragma once

#include "bf16_vec.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define LMISERVE_BF16_LANES 1
namespace lmiserve {

struct Bf16Lanes : F32x16 {
  static __mmask16 mask(int64_t n) { return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1u); }
  // the first min(n, 16) values of p, the other lanes 0
  static V load(const uint16_t* p, int64_t n) {
    if (n >= 16) return widen_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return widen_bf16(_mm256_maskz_loadu_epi16(mask(n), p));
  }
  // each lane rounded to bf16 (nearest even) into p[0 .. min(n, 16))
  static void store(uint16_t* p, V v, int64_t n) {
#if defined(__AVX512BF16__)
    _mm256_mask_storeu_epi16(p, mask(n), (__m256i)_mm512_cvtneps_pbh(v));
#else
    _mm512_mask_cvtepi32_storeu_epi16(p, mask(n), bf16_bits(v));
#endif
  }
  static V round(V v) { return round_bf16(v); }
};

}  // namespace lmiserve
#elif defined(__AVX2__) && defined(__FMA__)
#define LMISERVE_BF16_LANES 1
namespace lmiserve {

struct Bf16Lanes : F32x8 {
  static V load(const uint16_t* p, int64_t n) { return load_bf16x8(p, n); }
  static void store(uint16_t* p, V v, int64_t n) { store_bf16x8(p, v, n); }
  static V round(V v) { return round_bf16x8(v); }
};

}  // namespace lmiserve
#endif
