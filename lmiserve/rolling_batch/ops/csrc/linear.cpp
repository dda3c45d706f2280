// bf16 linear layers: y = x W^T (+ bias), sums in fp32, y rounded to bf16. On CPUs with
// AVX512_BF16 here; on AVX-512F and AVX2 ones the same packing and tiles run on FMAs, the weights
// widened to fp32 in registers (csrc/linear_fma.cpp).
//
// The weight (N, K) is packed once into groups of kCols = 48 output columns, each group laid out
// as [K/2][48][2]: for every pair of k, the 48 columns' two values side by side, which is what
// vdpbf16ps multiplies against a broadcast pair of x (16 columns, 2 k, one instruction). A tile
// is 8 rows of x by the 48 columns of a group: 24 accumulators in registers over the whole K.
// Threads split the groups (the columns), so each streams its own part of the weight once.
//
// Decode steps multiply a few rows by every weight of the model, which is read from memory each
// time: while a group is used, the cache lines of the thread's next group are requested, a few per
// pair of k, spread over the tiles, so the multiply never waits for a burst of loads (oneDNN's
// kernel at 32 rows runs at about half its peak here, waiting on the weights). With more rows the
// weight stays in the caches across tiles and the requests would only push it out, so they stop.
// Rows are taken in chunks whose x fits in L2 beside a group; K is cut in stretches past 768 pairs.
//
// A gate_up weight (gate rows, then as many up rows) may be packed gated: each group holds 24
// gate columns and the 24 up columns of the same units, so a tile ends with silu(gate) * up of
// its 24 units (the SwiGLU of the MLP, rounded as the activation kernel rounds) without writing
// gate_up out; or with gate and up in their own places, for a caller that adds to them first.
//
// Each row's sums are formed in the same order whatever the number of rows, so a row's result
// does not depend on the rest of the batch.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "build_class.h"
#include "count_dispatch.h"
#include "linear_tile.h"
#include "op_registration.h"
#include "task_queue.h"

namespace {

using namespace lmiserve_linear;

// The weight row of group g's column c (-1: padding).
int64_t weight_row(int64_t g, int64_t c, int64_t n, bool gated) {
  if (!gated) return g * kCols + c < n ? g * kCols + c : -1;
  const int64_t units = n / 2, unit = g * kUnits + c % kUnits;
  return unit < units ? unit + (c < kUnits ? 0 : units) : -1;
}

at::Tensor pack_linear_bf16(const at::Tensor& weight, bool gated) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kBFloat16, "pack_linear_bf16 takes a bf16 (N, K) weight");
  TORCH_CHECK(weight.size(1) % 2 == 0, "pack_linear_bf16 needs an even K");
  TORCH_CHECK(!gated || weight.size(0) % 2 == 0, "a gated weight has as many up rows as gate rows");
  const auto w = weight.contiguous();
  const int64_t n = w.size(0), k = w.size(1), pairs = k / 2;
  const int64_t groups = gated ? (n / 2 + kUnits - 1) / kUnits : (n + kCols - 1) / kCols;
  auto packed = at::zeros({groups, pairs, kCols, 2}, w.options());
  const uint16_t* src = reinterpret_cast<const uint16_t*>(w.data_ptr());
  uint16_t* dst = reinterpret_cast<uint16_t*>(packed.data_ptr());
  at::parallel_for(0, groups, 1, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g)
      for (int64_t c = 0; c < kCols; ++c) {
        const int64_t wr = weight_row(g, c, n, gated);
        if (wr < 0) continue;
        const uint16_t* row = src + wr * k;
        uint16_t* out = dst + g * pairs * kCols * 2 + c * 2;
        for (int64_t p = 0; p < pairs; ++p) {
          out[p * kCols * 2] = row[2 * p];
          out[p * kCols * 2 + 1] = row[2 * p + 1];
        }
      }
  });
  return packed;
}
LMISERVE_OP(pack_linear_bf16, "(Tensor weight, bool gated=False) -> Tensor");

}  // namespace

#if defined(LMISERVE_LINEAR_AVX512BF16)
namespace lmiserve_linear {
namespace {

template <int MR, bool PREFETCH>
void tile(const uint16_t* x, int64_t ldx, const uint16_t* b, int64_t pairs, const TileOut& out, const Ahead& ahead) {
  __m512 acc[MR][kPanels];
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < kPanels; ++j)
      acc[r][j] = out.first ? _mm512_setzero_ps() : _mm512_loadu_ps(out.part + (r * kPanels + j) * 16);
  const int32_t* rows[MR];
  for (int r = 0; r < MR; ++r) rows[r] = reinterpret_cast<const int32_t*>(x + r * ldx);
  // this tile's share of the next group's lines, kPanels * pairs / tiles of them, spread evenly
  // over its pairs: `owed` counts up by the share each pair and a line goes out per `tiles`
  const char* line = PREFETCH ? ahead.next + 64 * (ahead.tile * pairs * kPanels / ahead.tiles) : nullptr;
  int64_t owed = PREFETCH ? (ahead.tile * pairs * kPanels) % ahead.tiles : 0;
  for (int64_t p = 0; p < pairs; ++p) {
    if constexpr (PREFETCH) {
      for (owed += kPanels; owed >= ahead.tiles; owed -= ahead.tiles, line += 64) _mm_prefetch(line, _MM_HINT_T0);
    }
    const __m512bh* bv = reinterpret_cast<const __m512bh*>(b + p * kCols * 2);
    const __m512bh b0 = bv[0], b1 = bv[1], b2 = bv[2];
    for (int r = 0; r < MR; ++r) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32(rows[r][p]);
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], a, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], a, b1);
      acc[r][2] = _mm512_dpbf16_ps(acc[r][2], a, b2);
    }
  }
  if (!out.last) {
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < kPanels; ++j) _mm512_storeu_ps(out.part + (r * kPanels + j) * 16, acc[r][j]);
    return;
  }
  for (int r = 0; r < MR; ++r) finish_row(acc[r], out.y + r * out.ldy, out);
}

template <bool PREFETCH>
TileFn pick(int64_t rows) {
  return lmiserve::for_count<kRows>(std::min(rows, kRows), [](auto n) -> TileFn { return &tile<n(), PREFETCH>; });
}

std::atomic<int64_t> g_fma_from_rows{0};

}  // namespace

int64_t tile_rows() { return kRows; }

int64_t fma_from_rows() { return g_fma_from_rows.load(std::memory_order_relaxed); }

void set_fma_from_rows(int64_t rows) { g_fma_from_rows.store(rows, std::memory_order_relaxed); }

TileFn pick_tile(int64_t rows, bool prefetch, int64_t m) {
  const int64_t from = fma_from_rows();
  if (from > 0 && m >= from) return pick_fma_tile(rows, prefetch);
  return prefetch ? pick<true>(rows) : pick<false>(rows);
}

}  // namespace lmiserve_linear
#endif

namespace {

using namespace lmiserve_linear;

bool linear_bf16_supported() {
#if defined(LMISERVE_LINEAR_VECTOR)
  return true;
#else
  return false;
#endif
}
LMISERVE_ANY_OP(linear_bf16_supported, "() -> bool");

// From how many rows of x a product runs on the FMA tiles (csrc/linear_fma.cpp) instead of
// vdpbf16ps: 0 never, 1 always (the FMA-only builds, which have nothing else).
int64_t linear_bf16_fma_rows() {
#if defined(LMISERVE_LINEAR_VECTOR)
  return fma_from_rows();
#else
  return 0;
#endif
}
LMISERVE_ANY_OP(linear_bf16_fma_rows, "() -> int");

// Sets that for an AVX512_BF16 build: the two give the same bits where the CPU's vdpbf16ps is
// the two FMAs Intel documents, so only the speed changes (the caller measures both).
void set_linear_bf16_fma_rows(int64_t rows) {
  TORCH_CHECK(rows >= 0, "rows is 0 (never) or more");
#if defined(LMISERVE_LINEAR_AVX512BF16)
  TORCH_CHECK(fma_tile_rows() == tile_rows(), "the FMA tiles have as many rows as the vdpbf16ps ones");
  set_fma_from_rows(rows);
#else
  TORCH_CHECK(rows == linear_bf16_fma_rows(), "this build has one kind of tiles: it takes ", linear_bf16_fma_rows());
#endif
}
LMISERVE_ANY_OP(set_linear_bf16_fma_rows, "(int rows) -> ()");

// Which vector code this build's kernel runs: "avx512_bf16", "avx512", "avx2" or "none".
std::string linear_bf16_isa() { return linear_bf16_supported() ? lmiserve::build_class() : "none"; }
LMISERVE_ANY_OP(linear_bf16_isa, "() -> str");

// Whether the kernel runs on AMX tiles here (csrc/linear_amx.cpp).
bool linear_amx_usable() { return amx_usable(); }
LMISERVE_ANY_OP(linear_amx_usable, "() -> bool");

#if defined(LMISERVE_LINEAR_VECTOR)

// y (m, n) = x W^T for a plain packing; for a gated one, n is the output width: 2 x units
// (kGateUp) or units (kSwiglu).
void multiply(const uint16_t* x, const uint16_t* packed, const float* bias, uint16_t* y, int64_t m, int64_t n,
              int64_t k, Output output) {
  const int64_t units = output == kGateUp ? n / 2 : n;  // gated outputs only
  const int64_t group_cols = output == kGateUp || output == kSwiglu ? kUnits : kCols;
  const int64_t pairs = k / 2, groups = (units + group_cols - 1) / group_cols, group_elems = pairs * kCols * 2;
  const bool prefetch = m <= kPrefetchRows;
  const int64_t rows_per_tile = tile_rows();
  const int64_t chunk = std::max<int64_t>(rows_per_tile, (kChunkBytes / (2 * k)) / rows_per_tile * rows_per_tile);
  const int64_t stretches = (pairs + kPairsPerStretch - 1) / kPairsPerStretch;
  const int64_t stretch = (pairs + stretches - 1) / stretches;
  // on the FMA tiles with more than one group and tile, x is widened to fp32 once for them all
  // (a tile on bf16 x widens its rows again for every group)
  const bool widened = m >= fma_from_rows() && fma_from_rows() > 0 && groups > 1 && m > rows_per_tile;
  static thread_local std::vector<float> wide;
  if (widened) {
    if (static_cast<int64_t>(wide.size()) < m * k) wide.resize(m * k);
    float* w = wide.data();
    at::parallel_for(0, m, std::max<int64_t>(1, 16384 / k), [&](int64_t r0, int64_t r1) {
      widen_x(x + r0 * k, w + r0 * k, (r1 - r0) * k);
    });
  }
  const float* xw = wide.data();
  // a unit: one group of columns against one chunk of rows, the chunks in turn
  lmiserve::for_each_unit(groups * ((m + chunk - 1) / chunk), [&](auto take) {
    std::vector<float> part(stretches > 1 ? chunk * kCols : 0);
    std::vector<float> group_bias(kCols, 0.f);
    for (lmiserve::Taken u = take(); u.unit >= 0; u = take()) {
      const int64_t g = u.unit % groups, m0 = u.unit / groups * chunk;
      const int64_t m1 = std::min(m, m0 + chunk), tiles = (m1 - m0 + rows_per_tile - 1) / rows_per_tile;
      const uint16_t* b = packed + g * group_elems;
      const int64_t cols = std::min(group_cols, units - g * group_cols);  // units = n when plain
      if (bias) std::memcpy(group_bias.data(), bias + g * kCols, cols * sizeof(float));
      // the next group, likely this thread's (the first again after a chunk's last)
      const bool more = u.unit + 1 < u.end;
      const char* next = reinterpret_cast<const char*>(more ? packed + (u.unit + 1) % groups * group_elems : nullptr);
      for (int64_t p0 = 0; p0 < pairs; p0 += stretch) {
        const int64_t len = std::min(stretch, pairs - p0);
        for (int64_t t = 0; t < tiles; ++t) {
          const int64_t r0 = m0 + t * rows_per_tile, rows = std::min(rows_per_tile, m1 - r0);
          const TileOut out{y + r0 * n + g * group_cols, n, cols, bias ? group_bias.data() : nullptr,
                            part.data() + t * rows_per_tile * kCols, p0 == 0, p0 + len >= pairs, output, units};
          const bool ask = prefetch && next != nullptr && stretches == 1;
          if (widened)
            pick_fma_f32_tile(rows, ask)(xw + r0 * k + 2 * p0, k, b + p0 * kCols * 2, len, out, Ahead{next, t, tiles});
          else
            pick_tile(rows, ask, m)(x + r0 * k + 2 * p0, k, b + p0 * kCols * 2, len, out, Ahead{next, t, tiles});
        }
      }
    }
  });
}
#endif

// output: 0 y = x W^T; for a weight packed gated, 1 gate_up in the weight's column order, 2 its
// SwiGLU (out_features: the units, half the weight's rows). tiles: on AMX tiles where they can
// run it (csrc/linear_amx.cpp), else the vector kernel.
at::Tensor linear_bf16(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                       int64_t out_features, int64_t output, bool tiles) {
  TORCH_CHECK(linear_bf16_supported(), "linear_bf16 needs a CPU with AVX2 and FMA or AVX-512 (kernels built for it)");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && packed.scalar_type() == at::kBFloat16, "linear_bf16 takes bf16");
  TORCH_CHECK(packed.dim() == 4 && packed.size(2) == kCols && packed.size(3) == 2, "not a weight from pack_linear_bf16");
  const int64_t k = x.size(-1);
  TORCH_CHECK(packed.size(1) * 2 == k, "x has ", k, " features; the weight takes ", packed.size(1) * 2);
  TORCH_CHECK(output >= kPlain && output <= kSwiglu, "output is 0 (plain), 1 (gate and up) or 2 (SwiGLU)");
  const int64_t capacity = packed.size(0) * (output == kPlain ? kCols : output == kGateUp ? kCols : kUnits);
  TORCH_CHECK(out_features > 0 && out_features <= capacity && (output != kGateUp || out_features % 2 == 0),
              "out_features does not fit the weight");
  TORCH_CHECK(output == kPlain || !(bias.has_value() && bias->defined()), "a gated product takes no bias");
  const auto x2 = x.reshape({-1, k}).contiguous();
  const int64_t m = x2.size(0);
  auto shape = x.sizes().vec();
  shape.back() = out_features;
  auto y = at::empty(shape, x.options());
  if (m == 0) return y;
  at::Tensor bias_f32;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->numel() == out_features, "bias must have out_features values");
    bias_f32 = bias->to(at::kFloat).contiguous();
  }
#if defined(LMISERVE_LINEAR_VECTOR)
  const auto* xs = reinterpret_cast<const uint16_t*>(x2.data_ptr());
  const auto* ws = reinterpret_cast<const uint16_t*>(packed.data_ptr());
  const float* bs = bias_f32.defined() ? bias_f32.data_ptr<float>() : nullptr;
  auto* ys = reinterpret_cast<uint16_t*>(y.data_ptr());
  if (!(tiles && multiply_amx(xs, ws, bs, ys, m, out_features, k, static_cast<Output>(output))))
    multiply(xs, ws, bs, ys, m, out_features, k, static_cast<Output>(output));
#endif
  return y;
}
LMISERVE_OP(linear_bf16, "(Tensor x, Tensor packed, Tensor? bias, int out_features, int output=0, "
                         "bool tiles=False) -> Tensor");

// y (.., n) += x W^T for a plain packing: the product rounded to bf16, added to y, rounded again
// (as a product in bf16 added to y), on the vector code.
void linear_bf16_add_(const at::Tensor& y, const at::Tensor& x, const at::Tensor& packed) {
  TORCH_CHECK(linear_bf16_supported(), "linear_bf16_add_ needs a CPU with AVX2 and FMA or AVX-512 (kernels built for it)");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && packed.scalar_type() == at::kBFloat16 &&
                  y.scalar_type() == at::kBFloat16, "linear_bf16_add_ takes bf16");
  TORCH_CHECK(y.is_contiguous(), "linear_bf16_add_ needs a contiguous y");
  TORCH_CHECK(packed.dim() == 4 && packed.size(2) == kCols && packed.size(3) == 2, "not a weight from pack_linear_bf16");
  const int64_t k = x.size(-1), n = y.size(-1);
  TORCH_CHECK(packed.size(1) * 2 == k, "x has ", k, " features; the weight takes ", packed.size(1) * 2);
  TORCH_CHECK(n > 0 && n <= packed.size(0) * kCols, "y's width does not fit the weight");
  const auto x2 = x.reshape({-1, k}).contiguous();
  const int64_t m = x2.size(0);
  TORCH_CHECK(y.numel() == m * n, "y must have a row of out_features for each row of x");
  if (m == 0) return;
#if defined(LMISERVE_LINEAR_VECTOR)
  multiply(reinterpret_cast<const uint16_t*>(x2.data_ptr()), reinterpret_cast<const uint16_t*>(packed.data_ptr()),
           nullptr, reinterpret_cast<uint16_t*>(y.data_ptr()), m, n, k, kAdd);
#endif
}
LMISERVE_OP(linear_bf16_add_, "(Tensor(a!) y, Tensor x, Tensor packed) -> ()");

}  // namespace
