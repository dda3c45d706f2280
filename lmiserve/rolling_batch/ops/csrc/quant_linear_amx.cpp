// GGUF-block linear layers on AMX tiles, for bf16 x of many rows: y^T = W x^T a strip at a time.
//
// Each thread takes strips of 16 weight rows, two at a time (its share in order, then what is
// left of another's: csrc/task_queue.h), and they are the A tiles of every product. Their
// weights are dequantized into bf16 (the same bf16 weights as the vector kernel's, in the
// arranged order of csrc/gguf_layout.h) a step of 64 values of k at a time, each step just
// before the tile products that take it, so that the vector work of one step overlaps the tile
// products of the step before; with one or two chunks of x two steps' buffers take turns (8 KB,
// in L1), with more every step is kept for the later chunks. x, arranged the same way, is packed
// once a call as B tiles (16 rows of x by 16 pairs of k, zeros past the last row). Four tiles of
// sums (two strips by two chunks of 16 rows of x) stay in the tile registers over the whole K,
// so four tile products are in flight, then go to y transposed, with the bias, rounded to bf16.
//
// A row of x is only ever a column of B: its sums do not depend on the other rows.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "aligned_vector.h"
#include "gguf_layout.h"
#include "linear_tile.h"
#include "task_queue.h"

namespace lmiserve_gguf {

#if defined(LMISERVE_AMX)

namespace {

constexpr int64_t kStrip = 16;      // weight rows a strip (an A tile's rows)
constexpr int64_t kTileK = 32;      // arranged k a tile
constexpr int64_t kBElems = 512;    // bf16 values of one B tile: 16 pairs x 16 rows x 2
constexpr int64_t kStepVals = 64;   // arranged k dequantized at a time: two k tiles
constexpr int64_t kStepRows = 2 * kStrip;  // weight rows a step dequantizes: a unit's two strips

inline uint16_t u16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}

// One step of a unit's weights: rows [n0, n0 + rows) (rows <= 32; those past n zero), arranged
// values [64 p, 64 p + 64) (a Q4 pair, or two Q8 blocks), into out (row r at 64 r). Q4 rows take
// their scales and minimums from sc, which holds each row's sixteen of pairs 8 g to 8 g + 7 and
// is filled at the first pair of each group.
struct StepScales {
  __m512 d[32], m[32];
};

void dequant_step(const uint8_t* w, const Layout& L, int64_t n0, int64_t n, int64_t rows, int64_t p, uint16_t* out,
                  StepScales& sc) {
  const int64_t live = std::min(rows, n - n0);
  for (int64_t r = live; r < rows; ++r) std::memset(out + r * kStepVals, 0, kStepVals * sizeof(uint16_t));
  if (L.kind == kQ8_0) {
    for (int64_t r = 0; r < live; ++r) {
      const uint8_t* row = w + (n0 + r) * L.row_bytes;
      const uint8_t* scales = row + L.quant_bytes;
      for (int64_t b = 2 * p; b < std::min(2 * p + 2, L.blocks); ++b)
        _mm512_storeu_si512(out + r * kStepVals + (b - 2 * p) * 32,
                            (__m512i)q8_block_bf16(row + b * 32, _cvtsh_ss(u16(scales + 2 * b))));
    }
    return;
  }
  const bool q4_1 = L.kind == kQ4_1;
  const int64_t g = p / 8, i = p % 8;
  if (i == 0) {
    for (int64_t r = 0; r < live; ++r) {
      const uint8_t* d = w + (n0 + r) * L.row_bytes + L.quant_bytes;
      sc.d[r] = scales16(d, g, L.scales);
      sc.m[r] = q4_1 ? scales16(d + 2 * L.scales, g, L.scales) : _mm512_setzero_ps();
    }
  }
  for (int64_t r = 0; r < live; ++r) {
    const __m512 dp = pair_scales(sc.d[r], i);
    const __m512 mp = q4_1 ? pair_scales(sc.m[r], i) : _mm512_mul_ps(dp, _mm512_set1_ps(-8.f));
    __m512i lo, hi;
    q4_pair_bf16(w + (n0 + r) * L.row_bytes + p * 32, dp, mp, lo, hi);
    _mm512_storeu_si512(out + r * kStepVals, lo);
    _mm512_storeu_si512(out + r * kStepVals + 32, hi);
  }
}

// 16 rows' 16 32-bit values from `at` on, transposed into t (t[j]: value j of every row).
void transpose16(const float* const* rows, int64_t at, __m512* t) {
  __m512 a[16], b[16];
  for (int i = 0; i < 16; ++i) a[i] = _mm512_loadu_ps(rows[i] + at);
  for (int i = 0; i < 16; i += 2) {  // pairs of rows: 32-bit interleave
    b[i] = _mm512_unpacklo_ps(a[i], a[i + 1]);
    b[i + 1] = _mm512_unpackhi_ps(a[i], a[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // 64-bit interleave
    a[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(b[i]), _mm512_castps_pd(b[i + 2])));
    a[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(b[i]), _mm512_castps_pd(b[i + 2])));
    a[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(b[i + 1]), _mm512_castps_pd(b[i + 3])));
    a[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(b[i + 1]), _mm512_castps_pd(b[i + 3])));
  }
  // a[4q + r] holds, in each 128-bit lane L, rows 4q..4q+3 of column 4L + c(r), c = 0, 1, 2, 3
  // for r = 0, 1, 2, 3; gather the lanes: 128-bit blocks across the four groups of rows
  for (int r = 0; r < 4; ++r) {
    const __m512 g0 = _mm512_shuffle_f32x4(a[r], a[4 + r], 0x88), g1 = _mm512_shuffle_f32x4(a[r], a[4 + r], 0xDD);
    const __m512 g2 = _mm512_shuffle_f32x4(a[8 + r], a[12 + r], 0x88), g3 = _mm512_shuffle_f32x4(a[8 + r], a[12 + r], 0xDD);
    // column 4L + c(r) for L = 0..3: rows 0-3 | 4-7 | 8-11 | 12-15
    t[0 + r] = _mm512_shuffle_f32x4(g0, g2, 0x88);
    t[8 + r] = _mm512_shuffle_f32x4(g0, g2, 0xDD);
    t[4 + r] = _mm512_shuffle_f32x4(g1, g3, 0x88);
    t[12 + r] = _mm512_shuffle_f32x4(g1, g3, 0xDD);
  }
}

}  // namespace

bool amx_gguf(const uint16_t* x, int64_t m, const uint8_t* w, const Layout& L, int64_t n, const float* bias,
              uint16_t* y) {
  if (!lmiserve_linear::amx_usable()) return false;
  const int64_t lda = L.arranged(), ktiles = lda / kTileK, chunks = (m + 15) / 16, strips = (n + kStrip - 1) / kStrip;
  lmiserve::aligned_vector<uint16_t> xa(m * lda);
  arrange_x(reinterpret_cast<const c10::BFloat16*>(x), m, L, reinterpret_cast<c10::BFloat16*>(xa.data()));
  // B tiles: [chunk][k tile][pair][row][2]: 16 rows' pairs of k (32-bit units) transposed
  lmiserve::aligned_vector<uint16_t> bt(chunks * ktiles * kBElems);
  const lmiserve::aligned_vector<uint16_t> zeros(lda, 0);
  for (int64_t c = 0; c < chunks; ++c) {
    const float* rows[16];
    for (int64_t mi = 0; mi < 16; ++mi) {
      const uint16_t* src = 16 * c + mi < m ? xa.data() + (16 * c + mi) * lda : zeros.data();
      rows[mi] = reinterpret_cast<const float*>(src);
    }
    for (int64_t t = 0; t < ktiles; ++t) {
      __m512 pairs[16];
      transpose16(rows, t * 16, pairs);  // pairs[pi]: pair pi of k for the 16 rows
      float* tile = reinterpret_cast<float*>(bt.data() + (c * ktiles + t) * kBElems);
      for (int pi = 0; pi < 16; ++pi) _mm512_storeu_ps(tile + 16 * pi, pairs[pi]);
    }
  }
  // two strips against two chunks of x at a time: four independent tiles of sums
  const int64_t steps = (ktiles + 1) / 2;
  const bool keep_all = chunks > 2;  // later pairs of chunks take the same strips: keep every step
  lmiserve::for_each_unit((strips + 1) / 2, [&](auto take) {
    // tiles 0-3: sums (16 weight rows x 16 rows of x, fp32); 4-5: two strips' weights (16 rows
    // x 32 k); 6-7: two chunks of x (16 pairs of k x 16 rows x 2)
    lmiserve_linear::configure_tiles();
    lmiserve::aligned_vector<uint16_t> buf((keep_all ? steps : 2) * kStepRows * kStepVals);
    StepScales sc;
    alignas(64) float sums_tile[4][kStrip * 16];
    auto emit = [&](int64_t s, int64_t c, const float* tile) {  // sums of strip s, chunk c, to y
      const int64_t cols = std::min<int64_t>(kStrip, n - s * kStrip);
      const __mmask16 keep = static_cast<__mmask16>((1u << cols) - 1u);
      const __m512 b = bias ? _mm512_maskz_loadu_ps(keep, bias + s * kStrip) : _mm512_setzero_ps();
      __m512 t[16];
      const float* rows[16];
      for (int i = 0; i < 16; ++i) rows[i] = tile + 16 * i;
      transpose16(rows, 0, t);  // t[mi]: x row mi's sums for the strip's 16 weight rows
      for (int64_t mi = 0; mi < 16 && c * 16 + mi < m; ++mi)
        _mm256_mask_storeu_epi16(y + (c * 16 + mi) * n + s * kStrip, keep,
                                 (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(t[mi], b)));
    };
    for (lmiserve::Taken u = take(); u.unit >= 0; u = take()) {
      const int64_t s = 2 * u.unit;
      const bool two = s + 1 < strips;
      const int64_t rows = two ? kStepRows : kStrip;
      // the next pair of strips is likely this thread's: its rows are requested a share a step
      // (without the requests each row's first lines are waited for from memory)
      const int64_t next = u.unit + 1 < u.end ? (s + 2) * kStrip : n;
      for (int64_t c0 = 0; c0 < chunks; c0 += 2) {
        const bool pair = c0 + 1 < chunks;
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int64_t st = 0; st < steps; ++st) {
          uint16_t* const slot = buf.data() + (keep_all ? st : st % 2) * kStepRows * kStepVals;
          if (c0 == 0) {
            // a step's weights are dequantized just before the tile products that take them:
            // this vector work overlaps the tile products of the step before
            dequant_step(w, L, s * kStrip, n, rows, st, slot, sc);
            for (int64_t r = next + st * kStepRows / steps; r < std::min(n, next + (st + 1) * kStepRows / steps); ++r)
              prefetch_bytes(w + r * L.row_bytes, L.row_bytes);
          }
          for (int64_t t = 2 * st; t < std::min(2 * st + 2, ktiles); ++t) {
            const uint16_t* b = bt.data() + (c0 * ktiles + t) * kBElems;
            const uint16_t* a = slot + (t - 2 * st) * kTileK;
            _tile_loadd(4, a, kStepVals * 2);
            _tile_loadd(6, b, 64);
            _tile_dpbf16ps(0, 4, 6);
            if (pair) {
              _tile_loadd(7, b + ktiles * kBElems, 64);
              _tile_dpbf16ps(1, 4, 7);
            }
            if (two) {
              _tile_loadd(5, a + kStrip * kStepVals, kStepVals * 2);
              _tile_dpbf16ps(2, 5, 6);
              if (pair) _tile_dpbf16ps(3, 5, 7);
            }
          }
        }
        _tile_stored(0, sums_tile[0], 64);
        _tile_stored(1, sums_tile[1], 64);
        _tile_stored(2, sums_tile[2], 64);
        _tile_stored(3, sums_tile[3], 64);
        emit(s, c0, sums_tile[0]);
        if (pair) emit(s, c0 + 1, sums_tile[1]);
        if (two) emit(s + 1, c0, sums_tile[2]);
        if (two && pair) emit(s + 1, c0 + 1, sums_tile[3]);
      }
    }
    _tile_release();
  });
  return true;
}

#else

bool amx_gguf(const uint16_t*, int64_t, const uint8_t*, const Layout&, int64_t, const float*, uint16_t*) {
  return false;
}

#endif

}  // namespace lmiserve_gguf
