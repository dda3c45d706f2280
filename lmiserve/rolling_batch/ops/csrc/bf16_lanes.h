// One vector of bf16 values widened to fp32, with the few operations the element-wise kernels
// (norms, rotary, prompt attention's sums) need, so each kernel is written once for AVX-512 (16
// lanes) and AVX2 (8 lanes). bf16 loads and stores take a length, so a row's last partial vector
// needs no scalar tail; fp32 ones (load_f32, store_f32) are of whole vectors.

#pragma once

#include "bf16_vec.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define LMISERVE_BF16_LANES 1
namespace lmiserve {

struct Bf16Lanes {
  using V = __m512;
  static constexpr int64_t kWidth = 16;
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
  static V load_f32(const float* p) { return _mm512_loadu_ps(p); }
  static void store_f32(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float v) { return _mm512_set1_ps(v); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V fmsub(V a, V b, V c) { return _mm512_fmsub_ps(a, b, c); }
  static float sum(V v) { return _mm512_reduce_add_ps(v); }
};

}  // namespace lmiserve
#elif defined(__AVX2__) && defined(__FMA__)
#define LMISERVE_BF16_LANES 1
namespace lmiserve {

struct Bf16Lanes {
  using V = __m256;
  static constexpr int64_t kWidth = 8;
  static V load(const uint16_t* p, int64_t n) { return load_bf16x8(p, n); }
  static void store(uint16_t* p, V v, int64_t n) { store_bf16x8(p, v, n); }
  static V round(V v) { return round_bf16x8(v); }
  static V load_f32(const float* p) { return _mm256_loadu_ps(p); }
  static void store_f32(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float v) { return _mm256_set1_ps(v); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V fmsub(V a, V b, V c) { return _mm256_fmsub_ps(a, b, c); }
  static float sum(V v) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
  }
};

}  // namespace lmiserve
#endif
