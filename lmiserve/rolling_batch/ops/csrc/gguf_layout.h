// GGUF blocks as the CPU kernels keep them (csrc/quant_linear.cpp, csrc/quant_linear_amx.cpp).
//
// A weight row of K = 32 nb inputs is repacked once at load, as three arrays:
//   quants  Q4: the blocks' 16-byte quant arrays two blocks (a pair) at a time, 32 bytes a pair,
//               interleaved 2 bytes at a time (byte j of a pair comes from block (j / 2) % 2 of the
//               pair, its byte (j / 4) * 2 + j % 2); a missing last block is zeros.
//           Q8: the blocks' 32 int8 quants in order.
//   d       the fp16 scales, one per block (Q4: padded to whole pairs with zeros)
//   m       Q4_1 only: the fp16 minimums, likewise
// Widened byte by byte, a pair's 32 bytes give 32 words whose low nibbles are 32 quants and whose
// high nibbles are 32 more, and two neighbouring words always come from the same block: a bf16
// dot product's lane (a pair of words) is one block's, alternately the pair's first and second.
// x is arranged in the same order once a call (arrange_x), so no weight moves at run time.

#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include <type_traits>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

namespace lmiserve_gguf {

enum Kind : int64_t { kQ4_0 = 0, kQ4_1 = 1, kQ8_0 = 2 };
constexpr int64_t kBlock = 32;

constexpr int64_t gguf_block_bytes(int64_t kind) { return kind == kQ4_0 ? 18 : kind == kQ4_1 ? 20 : 34; }

struct Layout {
  int64_t kind, k, blocks, pairs;  // pairs: Q4 only (0 for Q8)
  int64_t quant_bytes, scales, row_bytes;  // scales: the length of d (and m)

  Layout(int64_t kind_, int64_t k_) : kind(kind_), k(k_), blocks(k_ / kBlock) {
    pairs = kind == kQ8_0 ? 0 : (blocks + 1) / 2;
    quant_bytes = kind == kQ8_0 ? blocks * 32 : pairs * 32;
    scales = kind == kQ8_0 ? blocks : pairs * 2;
    row_bytes = quant_bytes + 2 * scales * (kind == kQ4_1 ? 2 : 1);
  }
  int64_t arranged() const { return kind == kQ8_0 ? k : pairs * 64; }  // x values a row takes
};

// fn(std::integral_constant<int64_t, K>{}) for the block type K that `kind` names.
template <typename Fn>
inline void with_kind(int64_t kind, Fn&& fn) {
  switch (kind) {
    case kQ4_0: fn(std::integral_constant<int64_t, kQ4_0>{}); break;
    case kQ4_1: fn(std::integral_constant<int64_t, kQ4_1>{}); break;
    default: fn(std::integral_constant<int64_t, kQ8_0>{}); break;
  }
}

// csrc/quant_linear_avx2.cpp: y (m, n) = x W^T (+ bias) for arranged fp32 x, on AVX2 without
// AVX-512, the weights rounded to bf16 first where `bf16_weights` (x was bf16); false (nothing
// done) in builds for other classes.
bool avx2_gguf(const float* xa, int64_t m, const uint8_t* w, const Layout& L, int64_t n, const float* bias,
               bool bf16_weights, float* y);

inline float half_bits(uint16_t h) { return static_cast<float>(c10::Half(h, c10::Half::from_bits())); }

// Requests the cache lines of [p, p + bytes) (where the CPU has prefetch instructions).
inline void prefetch_bytes(const uint8_t* p, int64_t bytes) {
#if defined(__SSE2__)
  const uintptr_t end = reinterpret_cast<uintptr_t>(p) + bytes;
  for (uintptr_t a = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63}; a < end; a += 64)
    _mm_prefetch(reinterpret_cast<const char*>(a), _MM_HINT_T0);
#else
  (void)p;
  (void)bytes;
#endif
}

// Where arranged value i (0-63) of a pair comes from among the pair's 64 inputs.
inline int pair_source(int i) {
  const int h = i / 32, j = i % 32;
  return ((j / 2) % 2) * kBlock + (j / 4) * 2 + j % 2 + 16 * h;
}

// x rows in the kernels' order: Q4 per pair 32 low-nibble then 32 high-nibble inputs (inputs past
// the last block 0), Q8 as they are.
template <typename X, typename Out>
void arrange_x(const X* x, int64_t rows, const Layout& L, Out* xa) {
  int source[64];
  for (int i = 0; i < 64; ++i) source[i] = pair_source(i);
  for (int64_t r = 0; r < rows; ++r) {
    const X* row = x + r * L.k;
    Out* out = xa + r * L.arranged();
    if (L.kind == kQ8_0) {
      for (int64_t i = 0; i < L.k; ++i) out[i] = static_cast<Out>(row[i]);
      continue;
    }
#if defined(__AVX512BW__)
    if constexpr (sizeof(X) == 2 && sizeof(Out) == 2) {  // bf16: two word permutes a pair
      alignas(64) uint16_t lo_idx[32], hi_idx[32];
      for (int i = 0; i < 32; ++i) {
        lo_idx[i] = static_cast<uint16_t>(source[i]);
        hi_idx[i] = static_cast<uint16_t>(source[32 + i]);
      }
      const __m512i lo = _mm512_load_si512(lo_idx), hi = _mm512_load_si512(hi_idx);
      for (int64_t p = 0; p < L.pairs; ++p) {
        const int64_t left = L.k - 64 * p;  // inputs of this pair that exist: 32 or 64
        const __m512i a = _mm512_loadu_si512(row + 64 * p);
        const __m512i b = left > 32 ? _mm512_loadu_si512(row + 64 * p + 32) : _mm512_setzero_si512();
        _mm512_storeu_si512(out + 64 * p, _mm512_permutex2var_epi16(a, lo, b));
        _mm512_storeu_si512(out + 64 * p + 32, _mm512_permutex2var_epi16(a, hi, b));
      }
      continue;
    }
#endif
    int64_t p = 0;
#if defined(__SSE2__)
    if constexpr (std::is_same_v<X, float> && std::is_same_v<Out, float>) {
      // a whole pair's arranged values 32 h + 8 t... are inputs 16 h + 4 t... of its two blocks,
      // two at a time from each, alternately
      for (; 64 * p + 64 <= L.k; ++p)
        for (int h = 0; h < 2; ++h)
          for (int t = 0; t < 4; ++t) {
            const __m128d a = _mm_castps_pd(_mm_loadu_ps(row + 64 * p + 16 * h + 4 * t));
            const __m128d b = _mm_castps_pd(_mm_loadu_ps(row + 64 * p + 32 + 16 * h + 4 * t));
            _mm_storeu_ps(out + 64 * p + 32 * h + 8 * t, _mm_castpd_ps(_mm_unpacklo_pd(a, b)));
            _mm_storeu_ps(out + 64 * p + 32 * h + 8 * t + 4, _mm_castpd_ps(_mm_unpackhi_pd(a, b)));
          }
    }
#endif
    for (; p < L.pairs; ++p) {
      const int64_t left = L.k - 64 * p;
      for (int i = 0; i < 64; ++i)
        out[p * 64 + i] = source[i] < left ? static_cast<Out>(row[64 * p + source[i]]) : static_cast<Out>(0.f);
    }
  }
}

#if defined(__AVX512BW__)
// A row's Q4 scales (d, or Q4_1's minimums) for pairs 8 g to 8 g + 7, as fp32: sixteen blocks'.
inline __m512 scales16(const uint8_t* halves, int64_t g, int64_t count) {
  const int64_t left = count - 16 * g;
  const __mmask16 mask = left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1u);
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, halves + 32 * g));
}

// Pair i (0-7) of those sixteen scales as [s0 s1 s0 s1 ...]: its two blocks', alternately.
inline __m512 pair_scales(__m512 sixteen, int64_t i) {
  const __m512i idx = _mm512_add_epi32(_mm512_setr_epi32(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1),
                                       _mm512_set1_epi32(static_cast<int>(2 * i)));
  return _mm512_permutexvar_ps(idx, sixteen);
}

// R rows' Q4 scales (and Q4_1's minimums) for pairs 8 g to 8 g + 7, converted once; pair(r, i):
// pair 8 g + i's of row r as pair_scales gives them, the minimums -8 d for Q4_0.
template <int64_t KIND, int R>
struct Q4GroupScales {
  __m512 d[R], m[R];
  Q4GroupScales(const uint8_t* w, int64_t ldw, const Layout& L, int64_t g) {
    for (int r = 0; r < R; ++r) {
      const uint8_t* scales = w + r * ldw + L.quant_bytes;
      d[r] = scales16(scales, g, L.scales);
      m[r] = KIND == kQ4_1 ? scales16(scales + 2 * L.scales, g, L.scales) : _mm512_setzero_ps();
    }
  }
  void pair(int r, int64_t i, __m512& dp, __m512& mp) const {
    dp = pair_scales(d[r], i);
    mp = KIND == kQ4_1 ? pair_scales(m[r], i) : _mm512_mul_ps(dp, _mm512_set1_ps(-8.f));
  }
};

// A Q4 pair's 64 weights, d q + m in fp32 rounded to bf16, by table: the 32 values the pair can
// take (index 2 q + block: [d0 d1 d0 d1 ...] times [0 0 1 1 ...] plus the minimums) are computed
// once, and each quant looks its weight up (vpermw reads an index's low five bits). d and m: the
// pair's scales and minimums as pair_scales gives them. lo: the arranged positions 0-31 (low
// nibbles), hi: 32-63.

// The pair's 32 values before rounding: [0 0 1 1 ...] d + m (indices 0-15), then from 8 (16-31).
inline void q4_pair_values(__m512 d, __m512 m, __m512& lo, __m512& hi) {
  const __m512 iota_lo = _mm512_setr_ps(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  lo = _mm512_fmadd_ps(iota_lo, d, m);
  hi = _mm512_fmadd_ps(_mm512_add_ps(iota_lo, _mm512_set1_ps(8.f)), d, m);
}

// Each quant of a pair (32 bytes, two nibbles each) looked up in the pair's table of 32 bf16 values.
inline void q4_lookup(const uint8_t* quants, __m512i table, __m512i& lo, __m512i& hi) {
  const __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(quants)));
  // word j = byte j, from block (j / 2) % 2: words 0 1 are block 0, 2 3 block 1, ... (e31 first)
  const __m512i blocks = _mm512_set_epi16(1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1,
                                          1, 0, 0, 1, 1, 0, 0);
  lo = _mm512_permutexvar_epi16(_mm512_or_si512(_mm512_slli_epi16(w, 1), blocks), table);
  hi = _mm512_permutexvar_epi16(_mm512_ternarylogic_epi32(_mm512_srli_epi16(w, 3), _mm512_set1_epi16(30), blocks, 0xEA),
                                table);
}

#if defined(__AVX512BF16__)
inline void q4_pair_bf16(const uint8_t* quants, __m512 d, __m512 m, __m512i& lo, __m512i& hi) {
  __m512 vlo, vhi;
  q4_pair_values(d, m, vlo, vhi);
  q4_lookup(quants, (__m512i)_mm512_cvtne2ps_pbh(vhi, vlo), lo, hi);
}
#endif

#if defined(__AVX512BF16__)
// A Q8_0 block's 32 weights d q, each rounded to bf16 (exact in fp32 first: an fp16 d times an
// 8-bit q), in order: the bf16 weights the model's dequantized tensor holds, as the vector
// kernel's operands and the AMX strips both take them.
inline __m512bh q8_block_bf16(const uint8_t* quants, float scale) {
  const __m512 d = _mm512_set1_ps(scale);
  const __m128i* q = reinterpret_cast<const __m128i*>(quants);
  const __m512 lo = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q))));
  const __m512 hi = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q + 1))));
  return _mm512_cvtne2ps_pbh(hi, lo);
}

// Row `row`'s pairs [p0, p1) as bf16 weights, handed to fn(p, lo, hi) in order.
template <bool Q4_1, typename Fn>
inline void q4_row_pairs(const uint8_t* row, const Layout& L, int64_t p0, int64_t p1, Fn&& fn) {
  for (int64_t g = p0 / 8; 8 * g < p1; ++g) {
    const Q4GroupScales<Q4_1 ? kQ4_1 : kQ4_0, 1> scales(row, 0, L, g);
    for (int64_t p = std::max(p0, 8 * g); p < std::min(p1, 8 * g + 8); ++p) {
      __m512 dp, mp;
      scales.pair(0, p - 8 * g, dp, mp);
      __m512i lo, hi;
      q4_pair_bf16(row + p * 32, dp, mp, lo, hi);
      fn(p, lo, hi);
    }
  }
}
#endif  // __AVX512BF16__
#endif  // __AVX512BW__

}  // namespace lmiserve_gguf
