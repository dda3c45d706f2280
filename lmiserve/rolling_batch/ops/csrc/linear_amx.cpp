// The packed bf16 linear product on AMX tiles (Sapphire Rapids and later): the same packed weight
// as csrc/linear.cpp, the same outputs (plain, gate and up, SwiGLU), the same rounding at the end.
//
// A group's 48 columns are three B tiles per 16 pairs of k: its packing [K/2][48][2] is already
// the layout a tile multiply takes (a tile row is one pair of k for 16 columns), read with a
// stride of 192 bytes. x is read 16 rows by 32 k at a time (an A tile); a partial tile of rows is
// copied into a zeroed buffer first. Three tiles of 16 x 16 fp32 sums stay in the tile registers
// over a stretch of K (every tile of rows takes a stretch before the next, which stays in the
// first-level cache meanwhile), are kept in fp32 between stretches, then go through the same
// finish as the vector kernel's (a gated weight's SwiGLU two rows at a time, to the same values).
//
// Each row's sums are formed from its own x row only, in the order of k, whatever the other
// rows of the tile or the product: a row's result does not depend on the rest of the batch.
// Used where K is a multiple of 32 (whole tiles); the operating system must grant the process
// the tile state first (arch_prctl), which is asked for once.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstring>
#include <vector>

#include "linear_tile.h"
#include "task_queue.h"

#if defined(LMISERVE_AMX)
#include <sys/syscall.h>
#include <unistd.h>

namespace lmiserve_linear {

namespace {

constexpr int kReqTilePermission = 0x1023;  // ARCH_REQ_XCOMP_PERM
constexpr int kTileData = 18;               // XFEATURE_XTILEDATA
constexpr int64_t kTileRows = 16;
constexpr int64_t kTilePairs = 16;

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

}  // namespace

// All eight tiles as 16 rows of 64 bytes. Here tiles 0-2 are sums (16 rows x 16 fp32); 3: x (16
// rows x 16 pairs); 4-6: the weight (16 pairs x 16 columns x 2); csrc/quant_linear_amx.cpp uses 8.
void configure_tiles() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = kTileRows;
    cfg.bytes_per_row[t] = 64;
  }
  // GCC's _tile_loadconfig tells the compiler it reads 8 bytes of the 64: without this barrier the
  // rows and widths above are dropped as dead stores, and ldtilecfg faults on the half-set config
  asm volatile("" : : "r"(&cfg) : "memory");
  _tile_loadconfig(&cfg);
}

bool amx_usable() {
  static const bool granted = syscall(SYS_arch_prctl, kReqTilePermission, kTileData) == 0;
  return granted;
}

// Measured on a Sapphire Rapids core (48 KiB L1, 2 MiB L2) at SmolLM2's shapes: taking k in
// stretches pays from 4 tiles of rows, asking for the next stretch ahead from 11 (with fewer
// tiles the requests come in bursts that slow the products down).
constexpr int64_t kStretchTiles = 4, kAheadTiles = 11;

// Pairs of k per stretch: a group's stretch of the weight (192 bytes a pair) stays within about
// 28 KiB, so it is read from the first-level cache by every tile of rows after the first.
int64_t stretch_pairs(int64_t pairs) {
  constexpr int64_t kStretchBytes = 28 * 1024, kPairBytes = kCols * 2 * 2;
  const int64_t most = kStretchBytes / kPairBytes / kTilePairs * kTilePairs;
  const int64_t stretches = (pairs + most - 1) / most;
  return (pairs / kTilePairs + stretches - 1) / stretches * kTilePairs;  // even stretches of whole tiles
}

void amx_rows(const uint16_t* x, int64_t ldx, int64_t rows, const uint16_t* group, int64_t pairs, const TileOut& out,
              RowScratch& scratch) {
  // The weight is taken a stretch of k at a time, every tile of rows against it, so a stretch is
  // read from memory once and from the first-level cache after (a whole group of K is larger
  // than that cache); the sums of a tile wait in `part` between stretches, unrounded.
  // In the last stretch each tile's sums are finished while the next tile's products run: a few
  // of its rows after each block of products, so the vector units round (and for a gated weight,
  // take the SwiGLU of) one tile while the tile unit multiplies the next. Two buffers take turns.
  alignas(64) float sums[2][kTileRows * kCols];
  const int64_t tiles = (rows + kTileRows - 1) / kTileRows;
  const int64_t k = 2 * pairs, b_stride = kCols * 2 * 2;
  const int64_t stretch = tiles >= kStretchTiles ? stretch_pairs(pairs) : pairs;
  const int64_t held = tiles * kTileRows * kCols;  // whole tiles' sums
  if (stretch < pairs && static_cast<int64_t>(scratch.part.size()) < held) scratch.part.resize(held);
  const float* done = nullptr;  // the previous tile's sums, rows [next_row, done_rows) still to finish
  int64_t done_r0 = 0, done_rows = 0, next_row = 0;
  auto load_row = [&](int64_t r, __m512* acc) {
    const float* row = done + r * kCols;
    for (int j = 0; j < kPanels; ++j) acc[j] = _mm512_load_ps(row + 16 * j);
  };
  auto finish_until = [&](int64_t until) {
    if (out.output == kSwiglu) {  // rows in pairs; an odd one waits for its partner until the tile's last
      for (; next_row + 1 < until; next_row += 2) {
        __m512 a[kPanels], b[kPanels];
        load_row(next_row, a);
        load_row(next_row + 1, b);
        uint16_t* y = out.y + (done_r0 + next_row) * out.ldy;
        finish_swiglu_pair(a, b, y, y + out.ldy, out);
      }
      if (until < done_rows) return;
    }
    for (; next_row < until; ++next_row) {
      __m512 acc[kPanels];
      load_row(next_row, acc);
      finish_row(acc, out.y + (done_r0 + next_row) * out.ldy, out);
    }
  };
  for (int64_t p0 = 0; p0 < pairs; p0 += stretch) {
    const int64_t blocks = (std::min(pairs, p0 + stretch) - p0) / kTilePairs;
    const bool first = p0 == 0, last = p0 + stretch >= pairs;
    const uint16_t* b0 = group + p0 * kCols * 2;
    // the weight's next stretch (this group's, or after the last the next group's first: the
    // groups lie one after another) asked into the second-level cache over this stretch's tiles
    const char* ahead = reinterpret_cast<const char*>(b0 + blocks * kTilePairs * kCols * 2);
    const int64_t ahead_lines = tiles >= kAheadTiles ? stretch * (kCols * 4 / 64) : 0;
    int64_t asked = 0, slot = 0;
    int turn = 0;
    for (int64_t r0 = 0; r0 < rows; r0 += kTileRows, turn ^= 1) {
      const int64_t n = std::min(kTileRows, rows - r0);
      const uint16_t* a = x + r0 * ldx;
      int64_t lda = ldx;
      if (n < kTileRows) {  // the last rows, then zeros (copied once for all the groups)
        if (scratch.source != a || scratch.count != n || scratch.k != k) {
          scratch.rows.assign(kTileRows * k, 0);
          for (int64_t r = 0; r < n; ++r) std::memcpy(scratch.rows.data() + r * k, a + r * ldx, k * sizeof(uint16_t));
          scratch.source = a;
          scratch.count = n;
          scratch.k = k;
        }
        a = scratch.rows.data();
        lda = k;
      }
      float* part = last && first ? nullptr : scratch.part.data() + r0 * kCols;
      if (first) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
      } else {
        _tile_loadd(0, part, kCols * 4);
        _tile_loadd(1, part + 16, kCols * 4);
        _tile_loadd(2, part + 32, kCols * 4);
      }
      a += 2 * p0;
      for (int64_t blk = 0; blk < blocks; ++blk) {
        const uint16_t* bb = b0 + blk * kTilePairs * kCols * 2;
        _tile_loadd(3, a + blk * 2 * kTilePairs, lda * 2);
        _tile_loadd(4, bb, b_stride);
        _tile_loadd(5, bb + 32, b_stride);
        _tile_loadd(6, bb + 64, b_stride);
        _tile_dpbf16ps(0, 3, 4);
        _tile_dpbf16ps(1, 3, 5);
        _tile_dpbf16ps(2, 3, 6);
        for (const int64_t until = ++slot * ahead_lines / (tiles * blocks); asked < until; ++asked)
          _mm_prefetch(ahead + asked * 64, _MM_HINT_T1);
        if (done != nullptr) finish_until((blk + 1) * done_rows / blocks);
      }
      if (!last) {
        _tile_stored(0, part, kCols * 4);
        _tile_stored(1, part + 16, kCols * 4);
        _tile_stored(2, part + 32, kCols * 4);
        continue;
      }
      if (done != nullptr) finish_until(done_rows);
      float* mine = sums[turn];
      _tile_stored(0, mine, kCols * 4);
      _tile_stored(1, mine + 16, kCols * 4);
      _tile_stored(2, mine + 32, kCols * 4);
      done = mine;
      done_r0 = r0;
      done_rows = n;
      next_row = 0;
    }
  }
  if (done != nullptr) finish_until(done_rows);
}

bool multiply_amx(const uint16_t* x, const uint16_t* packed, const float* bias, uint16_t* y, int64_t m, int64_t n,
                  int64_t k, Output output) {
  if (k % (2 * kTilePairs) != 0 || !amx_usable()) return false;
  const int64_t units = output == kGateUp ? n / 2 : n;
  const int64_t group_cols = (output == kGateUp || output == kSwiglu) ? kUnits : kCols;
  const int64_t pairs = k / 2, groups = (units + group_cols - 1) / group_cols, group_elems = pairs * kCols * 2;
  const int64_t chunk = std::max<int64_t>(kTileRows, (kChunkBytes / (2 * k)) / kTileRows * kTileRows);
  // a unit: one group of columns against one chunk of rows, the chunks in turn
  lmiserve::for_each_unit(groups * ((m + chunk - 1) / chunk), [&](auto take) {
    configure_tiles();
    alignas(64) float group_bias[kCols] = {};
    RowScratch scratch;
    for (lmiserve::Taken u = take(); u.unit >= 0; u = take()) {
      const int64_t g = u.unit % groups, m0 = u.unit / groups * chunk, m1 = std::min(m, m0 + chunk);
      const int64_t cols = std::min(group_cols, units - g * group_cols);
      if (bias) std::memcpy(group_bias, bias + g * kCols, cols * sizeof(float));
      const TileOut out{y + m0 * n + g * group_cols, n, cols, bias ? group_bias : nullptr, nullptr, true, true,
                        output, units};
      amx_rows(x + m0 * k, k, m1 - m0, packed + g * group_elems, pairs, out, scratch);
    }
    _tile_release();
  });
  return true;
}

}  // namespace lmiserve_linear

#else

namespace lmiserve_linear {

bool amx_usable() { return false; }

bool multiply_amx(const uint16_t*, const uint16_t*, const float*, uint16_t*, int64_t, int64_t, int64_t, Output) {
  return false;
}

}  // namespace lmiserve_linear

#endif
