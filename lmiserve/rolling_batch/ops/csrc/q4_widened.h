// Q4 blocks against bf16 x on AVX-512 CPUs without bf16 arithmetic (csrc/quant_linear.cpp): the
// weights the model's bf16 tensor holds, bf16(d q + m), multiplied in fp32.
//
// Rounding each dequantized weight to bf16 by integer arithmetic costs more than the rest of the
// product, so it is done once a pair per row instead: the 32 values a pair can take are rounded
// into a table of bf16 words, the quants look their weights up (q4_lookup, as the AVX512_BF16
// kernel does), and each dword lane's two bf16 words are widened to fp32 by a shift and a mask. x
// comes deinterleaved to match (widened_x): per 32 arranged values, the 16 even ones, then the 16
// odd ones. A row's sums are formed in the same order whatever the number of rows.

#pragma once

#include <cstdint>

#include "bf16_vec.h"
#include "gguf_layout.h"

#if defined(__AVX512BW__) && !defined(__AVX512BF16__)
#define LMISERVE_Q4_WIDENED 1

namespace lmiserve_gguf {

// Arranged x rows (m rows of `lda` values, a multiple of 32) deinterleaved in place, as
// rows_q4_widened reads them.
inline void widened_x(float* xa, int64_t m, int64_t lda) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  for (int64_t i = 0; i < m * lda; i += 32) {
    const __m512 a = _mm512_loadu_ps(xa + i), b = _mm512_loadu_ps(xa + i + 16);
    _mm512_storeu_ps(xa + i, _mm512_permutex2var_ps(a, even, b));
    _mm512_storeu_ps(xa + i + 16, _mm512_permutex2var_ps(a, odd, b));
  }
}

// A pair's table of 32 bf16 words, rounded as vcvtne2ps2bf16 rounds.
inline __m512i q4_pair_table(__m512 d, __m512 m) {
  __m512 lo, hi;
  q4_pair_values(d, m, lo, hi);
  const __m512i words = _mm512_set_epi16(62, 60, 58, 56, 54, 52, 50, 48, 46, 44, 42, 40, 38, 36, 34, 32,  // e31 first:
                                         30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);  // the even words
  return _mm512_permutex2var_epi16(lmiserve::bf16_bits(lo), words, lmiserve::bf16_bits(hi));
}

// R weight rows (Q4_0 or Q4_1) against MR deinterleaved x rows: their sums into out[r * MR + m].
template <int64_t KIND, int R, int MR>
void rows_q4_widened(const uint8_t* w, int64_t ldw, const Layout& L, const float* xd, float* out) {
  const int64_t lda = L.arranged();
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  __m512 acc[R][MR];
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MR; ++m) acc[r][m] = _mm512_setzero_ps();
  for (int64_t g = 0; 8 * g < L.pairs; ++g) {  // eight pairs at a time: their scales converted once
    const Q4GroupScales<KIND, R> scales(w, ldw, L, g);
    for (int64_t p = 8 * g; p < std::min<int64_t>(L.pairs, 8 * g + 8); ++p) {
      __m512 xv[MR][4];
      for (int m = 0; m < MR; ++m)
        for (int j = 0; j < 4; ++j) xv[m][j] = _mm512_loadu_ps(xd + m * lda + p * 64 + 16 * j);
      for (int r = 0; r < R; ++r) {  // the next rows' quants asked for as these are used
        _mm_prefetch(reinterpret_cast<const char*>(w + (r + R) * ldw + p * 32), _MM_HINT_T0);
        __m512 dp, mp;
        scales.pair(r, p - 8 * g, dp, mp);
        __m512i lo, hi;
        q4_lookup(w + r * ldw + p * 32, q4_pair_table(dp, mp), lo, hi);
        const __m512 wv[4] = {_mm512_castsi512_ps(_mm512_slli_epi32(lo, 16)),
                              _mm512_castsi512_ps(_mm512_and_si512(lo, high)),
                              _mm512_castsi512_ps(_mm512_slli_epi32(hi, 16)),
                              _mm512_castsi512_ps(_mm512_and_si512(hi, high))};
        for (int m = 0; m < MR; ++m)
          for (int j = 0; j < 4; ++j) acc[r][m] = _mm512_fmadd_ps(wv[j], xv[m][j], acc[r][m]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MR; ++m) out[r * MR + m] = _mm512_reduce_add_ps(acc[r][m]);
}

}  // namespace lmiserve_gguf
#endif
