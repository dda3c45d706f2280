// The packed bf16 linear kernel (csrc/linear.cpp) on FMAs: the same packing ([K/2][48][2] per
// group of 48 columns), the same outputs, the same rounding at the end, with the weights widened
// to fp32 in registers. CPUs without AVX512_BF16 have only these tiles. Decode reads every weight
// from memory each step, so bf16 weights (half the bytes of fp32 ones) are what makes it fast.
// AVX512_BF16 builds have them too: on some of those CPUs vdpbf16ps issues at a quarter of the
// FMAs' rate (a 2-core Xeon here: 1.35 against 5.5 G instructions a second), and these tiles
// give the same bits (below), so linear.cpp takes them from the number of rows measured faster.
//
// A pair of k of 16 columns (AVX-512F) or 8 (AVX2) is one load: each 32-bit lane holds a column's
// even k in its low half and its odd k in its high half, so the even values are the lanes shifted
// left by 16 and the odd ones the lanes with the low half cleared, two vectors of fp32, each
// multiplied by its broadcast x value. x is widened to fp32 once a product (once a tile for a
// product of one tile or one group of columns). Each row's sums run over the pairs of k in order,
// the odd k's product first, one FMA a product, with x's denormals read as zero: vdpbf16ps's
// arithmetic, which Intel documents as those two FMAs (rounding to nearest even), except that
// vdpbf16ps also reads the weights' denormals as zero and flushes sums that fall below fp32's
// smallest normal, which these keep (a weight or a running sum below 1.2e-38). A row's result
// does not depend on the rest of the batch. Tiles: 8 rows x 48 columns (24 accumulators of 32) on
// AVX-512F; 2 rows x 48 columns (12 of AVX2's 16 registers) on AVX2. Rounded to bf16 by integer
// arithmetic.

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "count_dispatch.h"
#include "linear_tile.h"

#if defined(LMISERVE_LINEAR_VECTOR)

namespace lmiserve_linear {

void widen_x(const uint16_t* x, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits = static_cast<uint32_t>(x[i]) << 16;
    if ((bits & 0x7F800000u) == 0) bits &= 0x80000000u;
    std::memcpy(out + i, &bits, sizeof(float));
  }
}

namespace {

// This tile's share of the next group's lines, kLinesPerPair * pairs / tiles of them, spread evenly
// over its pairs: `owed` counts up by the share each pair and a line goes out per `tiles`.
struct Requests {
  const char* line;
  int64_t owed;
  Requests(const Ahead& ahead, int64_t pairs, bool on)
      : line(on ? ahead.next + 64 * (ahead.tile * pairs * kLinesPerPair / ahead.tiles) : nullptr),
        owed(on ? (ahead.tile * pairs * kLinesPerPair) % ahead.tiles : 0) {}
  void step(int64_t tiles) {
    for (owed += kLinesPerPair; owed >= tiles; owed -= tiles, line += 64) _mm_prefetch(line, _MM_HINT_T0);
  }
};

#if defined(__AVX512F__)

constexpr int kMaxRows = 8;
constexpr int kVecs = 3;  // 16-column vectors per group

// x already widened (rows ldxf floats apart, from the tile's first pair)
template <int MR, bool PREFETCH>
void tile_f32(const float* xs, int64_t ldxf, const uint16_t* b, int64_t pairs, const TileOut& out, const Ahead& ahead) {
  __m512 acc[MR][kVecs];
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < kVecs; ++j)
      acc[r][j] = out.first ? _mm512_setzero_ps() : _mm512_loadu_ps(out.part + r * kCols + 16 * j);
  const float* xf[MR];
  for (int r = 0; r < MR; ++r) xf[r] = xs + r * ldxf;
  Requests ask(ahead, pairs, PREFETCH);
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int64_t p = 0; p < pairs; ++p) {
    if constexpr (PREFETCH) ask.step(ahead.tiles);
    const __m512i* bv = reinterpret_cast<const __m512i*>(b + p * kCols * 2);
    __m512 even[kVecs], odd[kVecs];
    for (int j = 0; j < kVecs; ++j) {
      const __m512i v = _mm512_loadu_si512(bv + j);
      even[j] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
      odd[j] = _mm512_castsi512_ps(_mm512_and_si512(v, high));
    }
    for (int r = 0; r < MR; ++r) {
      const __m512 xe = _mm512_set1_ps(xf[r][2 * p]), xo = _mm512_set1_ps(xf[r][2 * p + 1]);
      for (int j = 0; j < kVecs; ++j) acc[r][j] = _mm512_fmadd_ps(xo, odd[j], acc[r][j]);
      for (int j = 0; j < kVecs; ++j) acc[r][j] = _mm512_fmadd_ps(xe, even[j], acc[r][j]);
    }
  }
  if (!out.last) {
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < kVecs; ++j) _mm512_storeu_ps(out.part + r * kCols + 16 * j, acc[r][j]);
    return;
  }
  for (int r = 0; r < MR; ++r) {
    __m512 row[kVecs];  // a copy: the accumulators' own addresses never escape, so they stay in registers
    std::copy(acc[r], acc[r] + kVecs, row);
    finish_row(row, out.y + r * out.ldy, out);
  }
}

#else  // AVX2

constexpr int kMaxRows = 2;
constexpr int kVecs = 6;  // 8-column vectors per group

using lmiserve::load_bf16x8;
using lmiserve::round_bf16x8;
using lmiserve::store_bf16x8;
using lmiserve::swiglu8;

// finish_row on 8-column vectors: acc[0-2] are a gated group's 24 gate units, acc[3-5] their up.
inline void finish_row(const __m256* acc, uint16_t* y, const TileOut& out) {
  const int64_t cols = out.cols;
  if (out.output == kGateUp || out.output == kSwiglu) {
    for (int j = 0; j < 3 && 8 * j < cols; ++j) {
      if (out.output == kGateUp) {
        store_bf16x8(y + 8 * j, acc[j], cols - 8 * j);
        store_bf16x8(y + out.units + 8 * j, acc[3 + j], cols - 8 * j);
      } else {
        store_bf16x8(y + 8 * j, swiglu8(round_bf16x8(acc[j]), round_bf16x8(acc[3 + j])), cols - 8 * j);
      }
    }
    return;
  }
  for (int j = 0; j < kVecs && 8 * j < cols; ++j) {
    __m256 v = acc[j];
    if (out.output == kAdd) {
      v = _mm256_add_ps(round_bf16x8(v), load_bf16x8(y + 8 * j, cols - 8 * j));
    } else if (out.bias) {
      v = _mm256_add_ps(v, _mm256_loadu_ps(out.bias + 8 * j));
    }
    store_bf16x8(y + 8 * j, v, cols - 8 * j);
  }
}

// The 12 accumulators are named variables (a0-a5: row 0, c0-c5: row 1), not an array: GCC keeps
// an array of them in registers but also stores each to the stack after every update.
#define LMISERVE_STEP(j, A, C)                                                                  \
  {                                                                                             \
    const __m256i v = _mm256_loadu_si256(bv + j);                                               \
    const __m256 odd = _mm256_castsi256_ps(_mm256_and_si256(v, high));                          \
    A = _mm256_fmadd_ps(_mm256_broadcast_ss(x0 + 2 * p + 1), odd, A);                           \
    if constexpr (MR == 2) C = _mm256_fmadd_ps(_mm256_broadcast_ss(x1 + 2 * p + 1), odd, C);    \
    const __m256 even = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));                          \
    A = _mm256_fmadd_ps(_mm256_broadcast_ss(x0 + 2 * p), even, A);                              \
    if constexpr (MR == 2) C = _mm256_fmadd_ps(_mm256_broadcast_ss(x1 + 2 * p), even, C);        \
  }

// x already widened (rows ldxf floats apart, from the tile's first pair)
template <int MR, bool PREFETCH>
void tile_f32(const float* xs, int64_t ldxf, const uint16_t* b, int64_t pairs, const TileOut& out, const Ahead& ahead) {
  static_assert(MR == 1 || MR == 2, "AVX2 tiles are of 1 or 2 rows");
  auto start = [&](int r, int j) {
    return out.first || r >= MR ? _mm256_setzero_ps() : _mm256_loadu_ps(out.part + r * kCols + 8 * j);
  };
  __m256 a0 = start(0, 0), a1 = start(0, 1), a2 = start(0, 2), a3 = start(0, 3), a4 = start(0, 4), a5 = start(0, 5);
  __m256 c0 = start(1, 0), c1 = start(1, 1), c2 = start(1, 2), c3 = start(1, 3), c4 = start(1, 4), c5 = start(1, 5);
  const float* x0 = xs;
  const float* x1 = xs + (MR - 1) * ldxf;
  Requests ask(ahead, pairs, PREFETCH);
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int64_t p = 0; p < pairs; ++p) {
    if constexpr (PREFETCH) ask.step(ahead.tiles);
    // x's broadcasts are loaded again for each vector (from L1): no register is left for them
    const __m256i* bv = reinterpret_cast<const __m256i*>(b + p * kCols * 2);
    LMISERVE_STEP(0, a0, c0)
    LMISERVE_STEP(1, a1, c1)
    LMISERVE_STEP(2, a2, c2)
    LMISERVE_STEP(3, a3, c3)
    LMISERVE_STEP(4, a4, c4)
    LMISERVE_STEP(5, a5, c5)
  }
  const __m256 rows[2][kVecs] = {{a0, a1, a2, a3, a4, a5}, {c0, c1, c2, c3, c4, c5}};
  for (int r = 0; r < MR; ++r) {
    if (!out.last) {
      for (int j = 0; j < kVecs; ++j) _mm256_storeu_ps(out.part + r * kCols + 8 * j, rows[r][j]);
    } else {
      finish_row(rows[r], out.y + r * out.ldy, out);
    }
  }
}
#undef LMISERVE_STEP

#endif

// A tile on bf16 x: its rows widened into a buffer of its own first.
template <int MR, bool PREFETCH>
void tile(const uint16_t* x, int64_t ldx, const uint16_t* b, int64_t pairs, const TileOut& out, const Ahead& ahead) {
  alignas(64) float xf[MR][2 * kPairsPerStretch];
  for (int r = 0; r < MR; ++r) widen_x(x + r * ldx, xf[r], 2 * pairs);
  tile_f32<MR, PREFETCH>(xf[0], 2 * kPairsPerStretch, b, pairs, out, ahead);
}

template <bool PREFETCH>
TileFn pick(int64_t rows) {
  return lmiserve::for_count<kMaxRows>(std::min<int64_t>(rows, kMaxRows),
                                       [](auto n) -> TileFn { return &tile<n(), PREFETCH>; });
}

template <bool PREFETCH>
FloatTileFn pick_f32(int64_t rows) {
  return lmiserve::for_count<kMaxRows>(std::min<int64_t>(rows, kMaxRows),
                                       [](auto n) -> FloatTileFn { return &tile_f32<n(), PREFETCH>; });
}

}  // namespace

int64_t fma_tile_rows() { return kMaxRows; }

TileFn pick_fma_tile(int64_t rows, bool prefetch) { return prefetch ? pick<true>(rows) : pick<false>(rows); }

FloatTileFn pick_fma_f32_tile(int64_t rows, bool prefetch) {
  return prefetch ? pick_f32<true>(rows) : pick_f32<false>(rows);
}

#if !defined(LMISERVE_LINEAR_AVX512BF16)
// FMA-only builds: these are the kernel's tiles
int64_t tile_rows() { return kMaxRows; }

TileFn pick_tile(int64_t rows, bool prefetch, int64_t) { return pick_fma_tile(rows, prefetch); }

int64_t fma_from_rows() { return 1; }
#endif

}  // namespace lmiserve_linear

#endif
