// AVX-512 helpers shared by the kernels that read and write bf16.

#pragma once

#if defined(__AVX512F__)
#include <immintrin.h>

#include <c10/util/BFloat16.h>


namespace lmiserve {

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

// Below this, e^x is taken as e^kMinExponent (1.6e-38, the smallest normal float): attention's
// masked lanes hold -1e30, whose e^x would underflow.
constexpr float kMinExponent = -87.f;

// e^x in each lane, within about one unit in the last place: x = n ln2 + r with |r| <= ln2 / 2,
// e^r by Cephes' expf polynomial, then scaled by 2^n.
inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.f)), _mm512_set1_ps(kMinExponent));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);  // ln2 in two parts
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  return _mm512_scalef_ps(y, n);
}

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
