// AVX-512 (and AVX2) helpers shared by the kernels that read and write bf16.

#pragma once

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstdint>

namespace lmiserve {

// Below this, e^x is taken as e^kMinExponent (1.6e-38, the smallest normal float): attention's
// masked lanes hold -1e30, whose e^x would underflow.
constexpr float kMinExponent = -87.f;

// The fp32 operations of one vector by the same names at both widths (mm: the intrinsics'
// prefix, V: the vector type), so that a kernel is written once for F32x16 (AVX-512) and F32x8
// (AVX2), each name one instruction.
#define LMISERVE_F32_LANE_OPS(mm, Vec)                                   \
  using V = Vec;                                                         \
  static V zero() { return mm##_setzero_ps(); }                          \
  static V set1(float v) { return mm##_set1_ps(v); }                     \
  static V load_f32(const float* p) { return mm##_loadu_ps(p); }         \
  static void store_f32(float* p, V v) { mm##_storeu_ps(p, v); }        \
  static V add(V a, V b) { return mm##_add_ps(a, b); }                   \
  static V sub(V a, V b) { return mm##_sub_ps(a, b); }                   \
  static V mul(V a, V b) { return mm##_mul_ps(a, b); }                   \
  static V max(V a, V b) { return mm##_max_ps(a, b); }                   \
  static V min(V a, V b) { return mm##_min_ps(a, b); }                   \
  static V fmadd(V a, V b, V c) { return mm##_fmadd_ps(a, b, c); }       \
  static V fmsub(V a, V b, V c) { return mm##_fmsub_ps(a, b, c); }       \
  static V fnmadd(V a, V b, V c) { return mm##_fnmadd_ps(a, b, c); }

// e^x in each lane of F's vectors, within about one unit in the last place: x = n ln2 + r with
// |r| <= ln2 / 2, e^r by Cephes' expf polynomial, then scaled by 2^n.
template <class F>
inline typename F::V exp_lanes(typename F::V x) {
  using V = typename F::V;
  x = F::max(F::min(x, F::set1(88.f)), F::set1(kMinExponent));
  const V n = F::round_to_int(F::mul(x, F::set1(1.44269504088896341f)));
  V r = F::fnmadd(n, F::set1(0.693359375f), x);  // ln2 in two parts
  r = F::fnmadd(n, F::set1(-2.12194440e-4f), r);
  V y = F::set1(1.9875691500e-4f);
  y = F::fmadd(y, r, F::set1(1.3981999507e-3f));
  y = F::fmadd(y, r, F::set1(8.3334519073e-3f));
  y = F::fmadd(y, r, F::set1(4.1665795894e-2f));
  y = F::fmadd(y, r, F::set1(1.6666665459e-1f));
  y = F::fmadd(y, r, F::set1(5.0000001201e-1f));
  y = F::fmadd(y, F::mul(r, r), F::add(r, F::set1(1.f)));
  return F::scale_pow2(y, n);
}

}  // namespace lmiserve
#endif

#if defined(__AVX2__) && defined(__FMA__)
namespace lmiserve {

// The 8-lane forms of the AVX-512 helpers below, the same arithmetic (for AVX2-only CPUs).

struct F32x8 {
  static constexpr int64_t kWidth = 8;
  LMISERVE_F32_LANE_OPS(_mm256, __m256)
  static V round_to_int(V v) { return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  // v 2^n for whole n in [-126, 127]: a normal float's exponent field (scalef's exact product)
  static V scale_pow2(V v, V n) {
    const __m256i scale = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(v, _mm256_castsi256_ps(scale));
  }
  static float sum(V v) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
  }
  static float reduce_max(V v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
  }
  static int equal_lanes(V a, V b) { return _mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_EQ_OQ)); }  // a bit a lane
};

// 8 bf16 lanes (as 16-bit integers) widened to fp32.
inline __m256 widen_bf16x8(__m128i h) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); }

// Each lane's bf16 (to nearest even, as vcvtneps2bf16 and torch round) in its low 16 bits, by
// integer arithmetic; a NaN stays a (quiet) NaN.
inline __m256i bf16_bits8(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  return _mm256_blendv_epi8(r, _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40)), nan);
}

// Each lane rounded to bf16, kept as fp32.
inline __m256 round_bf16x8(__m256 x) { return _mm256_castsi256_ps(_mm256_slli_epi32(bf16_bits8(x), 16)); }

// 8 fp32 lanes rounded to bf16 into y[0 .. n), n <= 8
inline void store_bf16x8(uint16_t* y, __m256 v, int64_t n) {
  if (n <= 0) return;
  const __m256i r = bf16_bits8(v);
  const __m128i h = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  if (n >= 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y), h);
    return;
  }
  alignas(16) uint16_t t[8];
  _mm_store_si128(reinterpret_cast<__m128i*>(t), h);
  std::copy(t, t + n, y);
}

// The first n (<= 8) bf16 values of p as fp32 (the other lanes 0).
inline __m256 load_bf16x8(const uint16_t* p, int64_t n) {
  if (n >= 8) return widen_bf16x8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  alignas(16) uint16_t t[8] = {};
  std::copy(p, p + std::max<int64_t>(n, 0), t);
  return widen_bf16x8(_mm_load_si128(reinterpret_cast<const __m128i*>(t)));
}

// exp16 below on 8 lanes: the same clamp, polynomial and scaling, operation for operation.
inline __m256 exp8(__m256 x) { return exp_lanes<F32x8>(x); }

// swiglu16 below on 8 lanes: silu(gate) rounded to bf16, times up (not yet rounded).
inline __m256 swiglu8(__m256 gate, __m256 up) {
  const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), gate));
  return _mm256_mul_ps(round_bf16x8(_mm256_div_ps(gate, _mm256_add_ps(_mm256_set1_ps(1.f), e))), up);
}

}  // namespace lmiserve
#endif

#if defined(__AVX512F__)
namespace lmiserve {

struct F32x16 {
  static constexpr int64_t kWidth = 16;
  LMISERVE_F32_LANE_OPS(_mm512, __m512)
  static V round_to_int(V v) { return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static V scale_pow2(V v, V n) { return _mm512_scalef_ps(v, n); }  // v 2^n
  static float sum(V v) { return _mm512_reduce_add_ps(v); }
  static float reduce_max(V v) { return _mm512_reduce_max_ps(v); }
  static int equal_lanes(V a, V b) { return _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ); }  // a bit a lane
};

// 16 bf16 lanes (as 16-bit integers) widened to fp32: a bf16 is the top half of its float.
inline __m512 widen_bf16(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }

// 16 bf16 values from p as fp32.
inline __m512 bf16x16(const c10::BFloat16* p) {
  return widen_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

#if defined(__AVX512BW__) && defined(__AVX512VL__)
// The first n (< 16) bf16 values from p as fp32, the other lanes 0.
inline __m512 bf16x16(const c10::BFloat16* p, int64_t n) {
  return widen_bf16(_mm256_maskz_loadu_epi16(static_cast<__mmask16>((1u << n) - 1u), p));
}
#endif

// 32 bf16 values -> their 16 even-indexed and 16 odd-indexed elements as fp32 (one shift, one
// mask: no cross-lane shuffle). Dot products and sums come out the same in this order; only an
// output is interleaved back.
inline void split_bf16(const c10::BFloat16* p, __m512& even, __m512& odd) {
  const __m512i x = _mm512_loadu_si512(p);
  even = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
  odd = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

// e^x in each lane (exp_lanes above).
inline __m512 exp16(__m512 x) { return exp_lanes<F32x16>(x); }

// tanh(x / cap) * cap in each lane (Gemma 2's capped attention scores), tanh from exp16:
// 1 - 2 / (e^2y + 1), y clamped to +-9 where tanh is 1 to fp32's precision.
inline __m512 softcap16(__m512 x, float cap) {
  __m512 y = _mm512_mul_ps(x, _mm512_set1_ps(1.f / cap));
  y = _mm512_max_ps(_mm512_min_ps(y, _mm512_set1_ps(9.f)), _mm512_set1_ps(-9.f));
  const __m512 e = exp16(_mm512_add_ps(y, y));
  const __m512 t = _mm512_sub_ps(_mm512_set1_ps(1.f), _mm512_div_ps(_mm512_set1_ps(2.f), _mm512_add_ps(e, _mm512_set1_ps(1.f))));
  return _mm512_mul_ps(t, _mm512_set1_ps(cap));
}

// Each lane's bf16 (rounded to nearest even, as vcvtneps2bf16 and torch round) in its low 16
// bits, by integer arithmetic; a NaN stays a (quiet) NaN.
inline __m512i bf16_bits(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  return _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
}

// Each lane rounded to bf16 (to nearest even), kept as fp32.
#if defined(__AVX512BF16__)
inline __m512 round_bf16(__m512 x) {
  return widen_bf16((__m256i)_mm512_cvtneps_pbh(x));
}
#else
inline __m512 round_bf16(__m512 x) { return _mm512_castsi512_ps(_mm512_slli_epi32(bf16_bits(x), 16)); }
#endif

// SwiGLU of bf16 gate and up values (in fp32 lanes), before the final rounding: silu(gate)
// rounded to bf16, times up, as the reference rounds (F.silu(gate) * up in bf16).
inline __m512 swiglu16(__m512 gate, __m512 up) {
  const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), gate));
  return _mm512_mul_ps(round_bf16(_mm512_div_ps(gate, _mm512_add_ps(_mm512_set1_ps(1.f), e))), up);
}

// Transposes 16 rows of 16 32-bit values in place: r[i] lane j <-> r[j] lane i.
inline void transpose16(__m512i* r) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  // rows now hold 4x4 blocks of 128-bit lanes; finish with two rounds of 128-bit shuffles
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], _MM_SHUFFLE(2, 0, 2, 0));
    t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], _MM_SHUFFLE(3, 1, 3, 1));
    t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], _MM_SHUFFLE(2, 0, 2, 0));
    t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], _MM_SHUFFLE(3, 1, 3, 1));
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], _MM_SHUFFLE(2, 0, 2, 0));
    r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], _MM_SHUFFLE(3, 1, 3, 1));
    r[i + 4] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], _MM_SHUFFLE(2, 0, 2, 0));
    r[i + 12] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], _MM_SHUFFLE(3, 1, 3, 1));
  }
}

}  // namespace lmiserve
#endif
