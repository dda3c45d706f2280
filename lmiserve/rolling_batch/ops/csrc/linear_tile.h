// The packed bf16 linear kernels' shared parts (csrc/linear.cpp, csrc/linear_amx.cpp): the
// packing's dimensions, what a product writes, and how a row's fp32 sums end up in y.

#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "aligned_vector.h"

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>

#include "bf16_vec.h"
#endif

// Which vector code the bf16 linear kernel has in this build: vdpbf16ps (csrc/linear.cpp), or
// bf16 weights widened to fp32 for FMAs on 16 lanes or on 8 (csrc/linear_fma.cpp).
#if defined(__AVX512BF16__)
#define LMISERVE_LINEAR_AVX512BF16 1
#elif defined(__AVX512F__)
#define LMISERVE_LINEAR_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__)
#define LMISERVE_LINEAR_AVX2 1
#endif
#if defined(LMISERVE_LINEAR_AVX512BF16) || defined(LMISERVE_LINEAR_AVX512) || defined(LMISERVE_LINEAR_AVX2)
#define LMISERVE_LINEAR_VECTOR 1
#endif

namespace lmiserve_linear {

constexpr int64_t kPanels = 3;            // 16-column vectors per group
constexpr int64_t kCols = 16 * kPanels;   // columns per group
constexpr int64_t kRows = 8;              // rows per tile
constexpr int64_t kPrefetchRows = 64;     // up to this many rows the next group is requested ahead
constexpr int64_t kPairsPerStretch = 768;  // pairs of k per stretch: a group's stretch is <= 147 KiB
constexpr int64_t kChunkBytes = 384 * 1024;  // x rows per chunk: at most this many bytes of x
constexpr int64_t kUnits = kCols / 2;        // gated packing: gate and up columns of 24 units a group

// What a product writes: y = x W^T, or for a weight packed gated, gate and up in their places
// (y = x W^T in the weight's own column order) or silu(gate) * up.
// kAdd (a plain weight only): y += round(x W^T), rounded again, as a product in bf16 added to y.
enum Output : int64_t { kPlain = 0, kGateUp = 1, kSwiglu = 2, kAdd = 3 };

// Where a tile's sums go: the first stretch of K starts them at zero (or at `part`), the last
// rounds them to bf16 in y (adding the bias), the others leave them in `part`.
struct TileOut {
  uint16_t* y;        // the group's first output column (kGateUp: its first gate column)
  int64_t ldy, cols;  // cols: the group's output columns (gated: its units)
  const float* bias;  // kCols values for this group, or nullptr
  float* part;        // the tile's rows x kCols partial sums between stretches
  bool first, last;
  Output output = kPlain;
  int64_t units = 0;  // gated: where the up columns start in y (kGateUp)
};

// Requests for the next group's cache lines spread over a group's tiles: tile `tile` of `tiles`
// asks, at pair p, for the lines numbered (tile * pairs + p) * kLinesPerPair / tiles onwards.
struct Ahead {
  const char* next;
  int64_t tile, tiles;
};
constexpr int64_t kLinesPerPair = kCols * 2 * 2 / 64;  // a pair of k of a group: 192 bytes

// A tile: `rows` rows of x (ldx elements apart) times `pairs` pairs of k of a group, finished as
// `out` says. The vector code has tiles of up to tile_rows() rows; pick_tile gives the one for
// `rows` rows of a product of `m`, requesting the next group's lines ahead or not. The FMA tiles
// (csrc/linear_fma.cpp) are the same for their rows; an AVX512_BF16 build has both and takes the
// FMA ones for products of fma_from_rows() rows or more (0: never).
using TileFn = void (*)(const uint16_t*, int64_t, const uint16_t*, int64_t, const TileOut&, const Ahead&);
#if defined(LMISERVE_LINEAR_VECTOR)
int64_t tile_rows();
TileFn pick_tile(int64_t rows, bool prefetch, int64_t m);
int64_t fma_tile_rows();
TileFn pick_fma_tile(int64_t rows, bool prefetch);
int64_t fma_from_rows();
// The FMA tiles on x already widened to fp32 (rows ldxf floats apart), for a product that widens
// all of x once instead of once per group; widen_x widens n values as they do (denormals read as
// zero, of their sign, as vdpbf16ps reads them).
using FloatTileFn = void (*)(const float*, int64_t, const uint16_t*, int64_t, const TileOut&, const Ahead&);
FloatTileFn pick_fma_f32_tile(int64_t rows, bool prefetch);
void widen_x(const uint16_t* x, float* out, int64_t n);
#endif

#if defined(__AVX512F__)

// 16 fp32 lanes rounded to bf16 into y[0 .. n), n <= 16
inline void store16(uint16_t* y, __m512 v, int64_t n) {
  if (n <= 0) return;
  const auto mask = static_cast<__mmask16>((1u << std::min<int64_t>(n, 16)) - 1u);
#if defined(__AVX512BF16__)
  _mm256_mask_storeu_epi16(y, mask, (__m256i)_mm512_cvtneps_pbh(v));
#else
  _mm512_mask_cvtepi32_storeu_epi16(y, mask, lmiserve::bf16_bits(v));
#endif
}

// The first n (<= 16) bf16 values of y, widened to fp32 (the other lanes 0).
inline __m512 load16(const uint16_t* y, int64_t n) {
#if defined(__AVX512BW__) && defined(__AVX512VL__)
  return lmiserve::widen_bf16(_mm256_maskz_loadu_epi16(static_cast<__mmask16>((1u << n) - 1u), y));
#else
  alignas(32) uint16_t v[16] = {};
  std::copy(y, y + n, v);
  return lmiserve::widen_bf16(_mm256_load_si256(reinterpret_cast<const __m256i*>(v)));
#endif
}

// A gated tile's row: acc[0] = gate units 0-15, acc[1] = gate 16-23 then up 0-7, acc[2] = up 8-23.
// up_units_lo: its up units 0-15. high_half: lanes 8-15 of v in lanes 0-7 (and again in 8-15).
inline __m512 up_units_lo(const __m512* acc) {
  return _mm512_permutex2var_ps(
      acc[1], _mm512_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23), acc[2]);
}
inline __m512 high_half(__m512 v) { return _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(3, 2, 3, 2)); }

// SwiGLU of gate and up as the product rounds them, then the activation's arithmetic.
inline __m512 gated_swiglu(__m512 gate, __m512 up) {
  return lmiserve::swiglu16(lmiserve::round_bf16(gate), lmiserve::round_bf16(up));
}

inline void store_gated(const __m512* acc, uint16_t* y, const TileOut& out) {
  const __m512 up_lo = up_units_lo(acc), up_hi = high_half(acc[2]);
  if (out.output == kGateUp) {
    store16(y, acc[0], out.cols);
    store16(y + 16, acc[1], out.cols - 16);
    store16(y + out.units, up_lo, out.cols);
    store16(y + out.units + 16, up_hi, out.cols - 16);
  } else {
    store16(y, gated_swiglu(acc[0], up_lo), out.cols);
    store16(y + 16, gated_swiglu(acc[1], up_hi), out.cols - 16);
  }
}

// Two gated rows' SwiGLU (kSwiglu), each value as store_gated gives it: units 0-15 of each row as
// there, and units 16-23 of both rows in one vector (row a's in lanes 0-7, b's in 8-15) instead of
// one each with half of its lanes unused.
inline void finish_swiglu_pair(const __m512* a, const __m512* b, uint16_t* ya, uint16_t* yb, const TileOut& out) {
  store16(ya, gated_swiglu(a[0], up_units_lo(a)), out.cols);
  store16(yb, gated_swiglu(b[0], up_units_lo(b)), out.cols);
  if (out.cols <= 16) return;
  const __m512 both = gated_swiglu(_mm512_shuffle_f32x4(a[1], b[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm512_shuffle_f32x4(a[2], b[2], _MM_SHUFFLE(3, 2, 3, 2)));
  store16(ya + 16, both, std::min<int64_t>(out.cols - 16, 8));
  store16(yb + 16, high_half(both), out.cols - 16);
}

// A row's kPanels vectors of fp32 sums, finished: bias added and rounded to bf16 (to nearest
// even), or for a gated weight, gate and up (or their SwiGLU) in their places.
inline void finish_row(const __m512* acc, uint16_t* y, const TileOut& out) {
  if (out.output == kAdd) {
    for (int j = 0; j < kPanels && 16 * j < out.cols; ++j) {
      const int64_t n = std::min<int64_t>(16, out.cols - 16 * j);
      store16(y + 16 * j, _mm512_add_ps(lmiserve::round_bf16(acc[j]), load16(y + 16 * j, n)), n);
    }
    return;
  }
  if (out.output != kPlain) {
    store_gated(acc, y, out);
    return;
  }
  for (int j = 0; j < kPanels && 16 * j < out.cols; ++j) {
    __m512 v = acc[j];
    if (out.bias) v = _mm512_add_ps(v, _mm512_loadu_ps(out.bias + 16 * j));
    store16(y + 16 * j, v, out.cols - 16 * j);
  }
}

#endif

}  // namespace lmiserve_linear

namespace lmiserve_linear {

// csrc/linear_amx.cpp: whether this process may use AMX tiles (asked of the kernel once), and
// y = x W^T on them for a packed weight; false (nothing written) where they cannot run it.
bool amx_usable();
bool multiply_amx(const uint16_t* x, const uint16_t* packed, const float* bias, uint16_t* y, int64_t m, int64_t n,
                  int64_t k, Output output);


#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#define LMISERVE_AMX 1
// One thread's share, its tiles configured (configure_tiles) and released (_tile_release) by
// the caller: `rows` rows of x (ldx elements apart) times one group of a packed weight (`pairs`
// pairs of k, a multiple of 16), each row finished as `out` says (out.y: row 0's first column of
// the group, out.ldy apart). `scratch`: the thread's buffers, kept from one call to the next.
struct RowScratch {
  // a last partial tile of rows copied out with zero rows after them, kept for the next group of
  // the same rows: 16 rows of K from `source`, the first `count` real
  lmiserve::aligned_vector<uint16_t> rows;
  const uint16_t* source = nullptr;
  int64_t count = 0, k = 0;
  lmiserve::aligned_vector<float> part;  // the rows' sums between stretches of k (rows x kCols)
};
void configure_tiles();
void amx_rows(const uint16_t* x, int64_t ldx, int64_t rows, const uint16_t* group, int64_t pairs, const TileOut& out,
              RowScratch& scratch);
#endif

}  // namespace lmiserve_linear
