// GGUF-block linear layers with fp32 (arranged) x on AVX2 without AVX-512 (csrc/quant_linear.cpp
// calls this first; elsewhere it is empty and says no).
//
// A thread takes groups of weight rows; each group's rows are dequantized once a call, as a whole
// row each, into fp32 (F16C for the scales, the quants widened with AVX2: w = fma(q, d, m), m = -8 d
// for Q4_0; Q8_0 w = d q, the same values as the fp32 dequantization), and then every x row is
// multiplied with them, a few x rows by a few weight rows at a time in registers. For bf16 x
// (widened) each weight is then rounded to bf16, the weight the model's bf16 tensor holds, as the
// AVX512_BF16 kernel multiplies it.
// Each output is eight lane sums over the arranged inputs in order, then the lanes added 0 to 7:
// the same order whatever the number of rows, so a row's result does not depend on the batch.

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "gguf_layout.h"
#include "task_queue.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && !defined(__AVX512F__)
#define LMISERVE_GGUF_AVX2 1
#include <immintrin.h>

#include "bf16_vec.h"
#endif

namespace lmiserve_gguf {

#if defined(LMISERVE_GGUF_AVX2)
namespace {

constexpr int kR = 4, kM = 2;  // a register tile: kM x rows by kR weight rows, 8 accumulators

// A pair's two scales (halves at `halves` + 4 p) as the arranged bytes take them: d0 d0 d1 d1 ...
inline __m256 pair_scales(const uint8_t* halves, int64_t p) {
  uint32_t both;
  std::memcpy(&both, halves + 4 * p, 4);
  const __m256 s = _mm256_cvtph_ps(_mm_set1_epi32(static_cast<int>(both)));  // d0 d1 d0 d1 ...
  return _mm256_permutevar8x32_ps(s, _mm256_setr_epi32(0, 0, 1, 1, 0, 0, 1, 1));
}

// 8 weights as the product takes them: rounded to bf16 for bf16 x (BF16W), else as they are.
template <bool BF16W>
inline void store_weights(float* out, __m256 w) {
  if constexpr (BF16W) w = lmiserve::round_bf16x8(w);
  _mm256_storeu_ps(out, w);
}

// One packed weight row into L.arranged() fp32 weights, in the arranged order.
template <int64_t KIND, bool BF16W>
void dequantize_row(const uint8_t* row, const Layout& L, float* out) {
  const uint8_t* d = row + L.quant_bytes;
  if constexpr (KIND == kQ8_0) {
    for (int64_t b = 0; b < L.blocks; ++b) {
      uint16_t h;
      std::memcpy(&h, d + 2 * b, 2);
      const __m256 dv = _mm256_set1_ps(_cvtsh_ss(h));
      for (int i = 0; i < 32; i += 8) {
        const __m128i q8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + b * 32 + i));
        store_weights<BF16W>(out + b * 32 + i, _mm256_mul_ps(dv, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8))));
      }
    }
  } else {
    const uint8_t* mins = d + 2 * L.scales;
    const __m256i low = _mm256_set1_epi32(0xF);
    for (int64_t p = 0; p < L.pairs; ++p) {
      const __m256 dv = pair_scales(d, p);
      const __m256 mv = KIND == kQ4_1 ? pair_scales(mins, p) : _mm256_mul_ps(dv, _mm256_set1_ps(-8.f));
      for (int j = 0; j < 32; j += 8) {  // byte j: low nibble is arranged value j, high 32 + j
        const __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + p * 32 + j)));
        store_weights<BF16W>(out + p * 64 + j, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(q, low)), dv, mv));
        store_weights<BF16W>(out + p * 64 + 32 + j, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(q, 4)), dv, mv));
      }
    }
  }
}

// MR x rows (xa, stride ld) by R dequantized weight rows (wb, stride ld): sums into s[m * R + r].
template <int R, int MR>
void tile(const float* wb, const float* xa, int64_t ld, float* s) {
  __m256 acc[MR][R];
  for (int m = 0; m < MR; ++m)
    for (int r = 0; r < R; ++r) acc[m][r] = _mm256_setzero_ps();
  for (int64_t i = 0; i < ld; i += 8) {
    __m256 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = _mm256_loadu_ps(wb + r * ld + i);
    for (int m = 0; m < MR; ++m) {
      const __m256 xv = _mm256_loadu_ps(xa + m * ld + i);
      for (int r = 0; r < R; ++r) acc[m][r] = _mm256_fmadd_ps(wv[r], xv, acc[m][r]);
    }
  }
  alignas(32) float lanes[8];
  for (int m = 0; m < MR; ++m)
    for (int r = 0; r < R; ++r) {
      _mm256_store_ps(lanes, acc[m][r]);
      float v = 0.f;
      for (int i = 0; i < 8; ++i) {  // in this order in every tile, -ffast-math or not
        v += lanes[i];
        asm("" : "+x"(v));
      }
      s[m * R + r] = v;
    }
}

template <int R>
void tile_rows(const float* wb, const float* xa, int64_t ld, int64_t mr, float* s) {
  static_assert(kM == 2, "a tile of one or two x rows");
  if (mr == kM) tile<R, kM>(wb, xa, ld, s);
  else tile<R, 1>(wb, xa, ld, s);
}

template <int64_t KIND, bool BF16W>
void multiply(const float* xa, int64_t m, const uint8_t* w, const Layout& L, int64_t n, const float* bias, float* y) {
  const int64_t ld = L.arranged();
  // rows dequantized together: about 32 KiB of fp32 weights, whole register tiles
  const int64_t group = std::clamp<int64_t>(8192 / ld / kR, 1, 4) * kR;
  const int64_t groups = (n + group - 1) / group;
  lmiserve::for_each_unit(groups, [&](auto take) {
    std::vector<float> wb(group * ld);
    float s[kM * kR];
    for (lmiserve::Taken u = take(); u.unit >= 0; u = take()) {
      const int64_t g = u.unit, n0 = g * group, rows = std::min<int64_t>(group, n - n0);
      for (int64_t r = 0; r < rows; ++r) dequantize_row<KIND, BF16W>(w + (n0 + r) * L.row_bytes, L, wb.data() + r * ld);
      for (int64_t m0 = 0; m0 < m; m0 += kM) {
        const int64_t mr = std::min<int64_t>(kM, m - m0);
        for (int64_t r0 = 0; r0 < rows;) {
          const int64_t rr = rows - r0 >= kR ? kR : 1;
          if (rr == kR) tile_rows<kR>(wb.data() + r0 * ld, xa + m0 * ld, ld, mr, s);
          else tile_rows<1>(wb.data() + r0 * ld, xa + m0 * ld, ld, mr, s);
          for (int64_t i = 0; i < mr; ++i)
            for (int64_t r = 0; r < rr; ++r) {
              const int64_t col = n0 + r0 + r;
              y[(m0 + i) * n + col] = s[i * rr + r] + (bias ? bias[col] : 0.f);
            }
          r0 += rr;
        }
      }
    }
  });
}

}  // namespace

bool avx2_gguf(const float* xa, int64_t m, const uint8_t* w, const Layout& L, int64_t n, const float* bias,
               bool bf16_weights, float* y) {
  with_kind(L.kind, [&](auto kind) {
    if (bf16_weights) multiply<decltype(kind)::value, true>(xa, m, w, L, n, bias, y);
    else multiply<decltype(kind)::value, false>(xa, m, w, L, n, bias, y);
  });
  return true;
}
#else
bool avx2_gguf(const float*, int64_t, const uint8_t*, const Layout&, int64_t, const float*, bool, float*) {
  return false;
}
#endif

}  // namespace lmiserve_gguf
