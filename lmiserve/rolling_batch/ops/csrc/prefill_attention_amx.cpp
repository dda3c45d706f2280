// Paged prefill attention for bf16 caches on AMX tiles (the task split, the causal bounds and the
// output are those of prefill_attention.cpp, which calls this where the tiles can run).
//
// A task's queries (up to 16 rows of one sequence, for each of the G query heads that share a KV
// head) go over the keys 32 at a time, aligned to positions that are multiples of 32. For each
// stretch of 32 keys:
// - the keys are transposed once into pairs of dimensions (B tiles: a row is one pair of
//   dimensions for 16 keys) and the values interleaved by pairs of keys (B tiles: a row is one
//   pair of keys for 16 dimensions); keys past the sequence are zeros;
// - per query head, scores = q K^T on the tiles (exact products of bf16, fp32 sums), then the
//   online softmax in fp32 on the vector units, a running maximum per query as in the vector
//   kernels;
// - the probabilities go to the tiles rounded to bf16, as torch's fused CPU attention rounds them
//   for its P V product (the totals are summed before rounding, in fp32, as there);
// - P V is added to the fp32 sums, scaled first by the change of the running maximum.
// A query's result depends on its own row, the keys and the stretches' fixed positions only.

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "aligned_vector.h"
#include "count_dispatch.h"
#include "linear_tile.h"
#include "prefill_task.h"
#include "task_queue.h"

namespace lmiserve {

#if defined(LMISERVE_AMX)
namespace {

constexpr float kLowest = -1e30f;  // finite: the kernels are built with -ffast-math
constexpr int64_t kKeys = 32;      // keys per stretch: a row of probabilities is one A tile row
constexpr int64_t kRows = kPrefillRows;

// Where 32 keys' tiles are built: K^T as [half][dims / 32][16 pairs][16 keys x 2] and V as
// [dims / 16][16 pairs of keys][16 dims x 2], 1 KiB a tile.
struct StretchTiles {
  aligned_vector<uint16_t> kt, vb;
};

// 32 keys from position t0 (`width` of them in the sequence; the rest zeros) of one KV head.
template <int DW>
void build_stretch(StretchTiles& st, const c10::BFloat16* k_cache, const c10::BFloat16* v_cache, const int32_t* table,
                   int64_t t0, int64_t width, int64_t kv_head, const PrefillShape& sh) {
  constexpr int64_t dim = 32 * DW;
  const int64_t slot_stride = sh.kv_heads * dim;
  const c10::BFloat16* krow[kKeys];
  const c10::BFloat16* vrow[kKeys];
  for (int64_t j = 0; j < kKeys; ++j) {
    if (j >= width) {
      krow[j] = vrow[j] = nullptr;
      continue;
    }
    const int64_t t = t0 + j;
    const int64_t slot = static_cast<int64_t>(table[t / sh.block_size]) * sh.block_size + t % sh.block_size;
    krow[j] = k_cache + slot * slot_stride + kv_head * dim;
    vrow[j] = v_cache + slot * slot_stride + kv_head * dim;
  }
  for (int64_t half = 0; half < 2; ++half)
    for (int w = 0; w < DW; ++w) {
      __m512i block[16];
      for (int j = 0; j < 16; ++j) {
        const c10::BFloat16* k = krow[16 * half + j];
        block[j] = k != nullptr ? _mm512_loadu_si512(k + 32 * w) : _mm512_setzero_si512();
      }
      transpose16(block);  // block[p]: the pair of dimensions p of the 16 keys
      __m512i* dst = reinterpret_cast<__m512i*>(st.kt.data()) + (half * DW + w) * 16;
      for (int p = 0; p < 16; ++p) _mm512_store_si512(dst + p, block[p]);
    }
  // V: dims d of keys 2i and 2i+1 side by side
  const __m512i lo_idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                          37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i hi_idx = _mm512_add_epi16(lo_idx, _mm512_set1_epi16(16));
  __m512i* vb = reinterpret_cast<__m512i*>(st.vb.data());
  for (int64_t i = 0; i < kKeys / 2; ++i)
    for (int w = 0; w < DW; ++w) {
      const c10::BFloat16 *a = vrow[2 * i], *b = vrow[2 * i + 1];
      const __m512i va = a != nullptr ? _mm512_loadu_si512(a + 32 * w) : _mm512_setzero_si512();
      const __m512i vbb = b != nullptr ? _mm512_loadu_si512(b + 32 * w) : _mm512_setzero_si512();
      _mm512_store_si512(vb + (2 * w) * 16 + i, _mm512_permutex2var_epi16(va, lo_idx, vbb));
      _mm512_store_si512(vb + (2 * w + 1) * 16 + i, _mm512_permutex2var_epi16(va, hi_idx, vbb));
    }
}

// One query head's state over a task: 16 rows of fp32 sums, running maximum and total.
template <int DW>
struct HeadSums {
  alignas(64) float acc[kRows * 32 * DW];
  alignas(64) float run_max[kRows];
  alignas(64) float run_sum[kRows];
};

// One query head (q: 16 rows x dim, zero rows past the task's) over one stretch.
template <int DW>
void attend(const StretchTiles& st, const uint16_t* q, int64_t rows, int64_t t0, int64_t pos0, const PrefillShape& sh,
            HeadSums<DW>& hs) {
  constexpr int64_t dim = 32 * DW;
  alignas(64) float scores[kRows * kKeys];
  alignas(64) uint16_t probs[kRows * kKeys];
  alignas(64) float pv[kRows * 64];
  const uint16_t* kt = st.kt.data();
  // scores: tile 0 keys 0-15, tile 1 keys 16-31; q in tile 2, keys in tiles 3 and 4
  _tile_zero(0);
  _tile_zero(1);
  for (int w = 0; w < DW; ++w) {
    _tile_loadd(2, q + 32 * w, dim * 2);
    _tile_loadd(3, kt + w * 512, 64);
    _tile_loadd(4, kt + (DW + w) * 512, 64);
    _tile_dpbf16ps(0, 2, 3);
    _tile_dpbf16ps(1, 2, 4);
  }
  _tile_stored(0, scores, kKeys * 4);
  _tile_stored(1, scores + 16, kKeys * 4);
  // the online softmax: each row's scores scaled, capped and masked, the new maximum ...
  const __m512 scale = _mm512_set1_ps(sh.scale), lowest = _mm512_set1_ps(kLowest);
  alignas(64) float shift[kRows] = {0.f};
  for (int64_t r = 0; r < kRows; ++r) {
    const int64_t pos = pos0 + r;
    const int64_t first = sh.window > 0 ? pos - sh.window + 1 : 0;
    const int64_t lo = std::max<int64_t>(first - t0, 0), hi = std::min<int64_t>(pos + 1 - t0, kKeys);
    const uint64_t live = r < rows && hi > lo ? ((uint64_t{1} << hi) - 1) & ~((uint64_t{1} << lo) - 1) : 0;
    float* s = scores + r * kKeys;
    __m512 a = _mm512_mul_ps(_mm512_load_ps(s), scale), b = _mm512_mul_ps(_mm512_load_ps(s + 16), scale);
    if (sh.softcap > 0.f) {
      a = softcap16(a, sh.softcap);
      b = softcap16(b, sh.softcap);
    }
    a = _mm512_mask_blend_ps(static_cast<__mmask16>(live), lowest, a);
    b = _mm512_mask_blend_ps(static_cast<__mmask16>(live >> 16), lowest, b);
    _mm512_store_ps(s, a);
    _mm512_store_ps(s + 16, b);
    const float top = std::max(hs.run_max[r], _mm512_reduce_max_ps(_mm512_max_ps(a, b)));
    shift[r] = hs.run_max[r] - top;
    hs.run_max[r] = top;
  }
  alignas(64) float corr[kRows];
  _mm512_store_ps(corr, exp16(_mm512_load_ps(shift)));
  // ... then the probabilities (masked keys exactly 0) in bf16, and the totals
  for (int64_t r = 0; r < kRows; ++r) {
    const float* s = scores + r * kKeys;
    const __m512 top = _mm512_set1_ps(hs.run_max[r]);
    const __m512 la = _mm512_load_ps(s), lb = _mm512_load_ps(s + 16);
    const __m512 ea = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(la, lowest, _CMP_GT_OQ), exp16(_mm512_sub_ps(la, top)));
    const __m512 eb = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(lb, lowest, _CMP_GT_OQ), exp16(_mm512_sub_ps(lb, top)));
    hs.run_sum[r] = hs.run_sum[r] * corr[r] + _mm512_reduce_add_ps(_mm512_add_ps(ea, eb));
    _mm512_store_si512(probs + r * kKeys, (__m512i)_mm512_cvtne2ps_pbh(eb, ea));
  }
  // P V, 64 dimensions at a time: sums in tiles 0-3, P in 4, V in 6 and 7
  _tile_loadd(4, probs, kKeys * 2);
  const uint16_t* vb = st.vb.data();
  for (int64_t d0 = 0; d0 < dim; d0 += 64) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    const uint16_t* v = vb + (d0 / 16) * 512;
    _tile_loadd(6, v, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_loadd(7, v + 512, 64);
    _tile_dpbf16ps(1, 4, 7);
    _tile_loadd(6, v + 1024, 64);
    _tile_dpbf16ps(2, 4, 6);
    _tile_loadd(7, v + 1536, 64);
    _tile_dpbf16ps(3, 4, 7);
    _tile_stored(0, pv, 64 * 4);
    _tile_stored(1, pv + 16, 64 * 4);
    _tile_stored(2, pv + 32, 64 * 4);
    _tile_stored(3, pv + 48, 64 * 4);
    for (int64_t r = 0; r < rows; ++r) {
      const __m512 c = _mm512_set1_ps(corr[r]);
      float* o = hs.acc + r * dim + d0;
      for (int l = 0; l < 4; ++l)
        _mm512_store_ps(o + 16 * l, _mm512_fmadd_ps(_mm512_load_ps(o + 16 * l), c, _mm512_load_ps(pv + r * 64 + 16 * l)));
    }
  }
}

template <int G, int DW>
void prefill_tasks(c10::BFloat16* out, const c10::BFloat16* q, const c10::BFloat16* k_cache,
                   const c10::BFloat16* v_cache, const int32_t* block_tables, const int32_t* cu_q_lens,
                   const int32_t* seq_lens, const std::vector<PrefillTask>& tasks, const PrefillShape& sh) {
  constexpr int64_t dim = 32 * DW;
  for_each_task(static_cast<int64_t>(tasks.size()), [&](const auto& next) {
    lmiserve_linear::configure_tiles();
    StretchTiles st;
    st.kt.resize(2 * DW * 512);
    st.vb.resize(2 * DW * 512);
    aligned_vector<uint16_t> qs(G * kRows * dim);
    std::vector<HeadSums<DW>> heads(G);
    for (int64_t i; (i = next()) >= 0;) {
      const PrefillTask& task = tasks[i];
      const TaskRows span = task_rows(task, cu_q_lens, seq_lens, block_tables, sh.max_blocks, sh.window);
      // each head's 16 rows of q, zeros past the task's rows
      std::fill(qs.begin(), qs.end(), 0);
      for (int64_t g = 0; g < G; ++g) {
        for (int64_t r = 0; r < task.rows; ++r)
          std::memcpy(qs.data() + (g * kRows + r) * dim,
                      q + (span.row_lo + r) * sh.q_stride_t + (task.kv_head * G + g) * sh.q_stride_h, dim * 2);
        std::fill(heads[g].acc, heads[g].acc + kRows * dim, 0.f);
        std::fill(heads[g].run_max, heads[g].run_max + kRows, kLowest);
        std::fill(heads[g].run_sum, heads[g].run_sum + kRows, 0.f);
      }
      for (int64_t t0 = (span.first_key / kKeys) * kKeys; t0 <= span.last_key; t0 += kKeys) {
        build_stretch<DW>(st, k_cache, v_cache, span.table, t0, std::min<int64_t>(kKeys, span.len - t0), task.kv_head,
                          sh);
        for (int64_t g = 0; g < G; ++g)
          attend<DW>(st, qs.data() + g * kRows * dim, task.rows, t0, span.pos0, sh, heads[g]);
      }
      for (int64_t g = 0; g < G; ++g)
        for (int64_t r = 0; r < task.rows; ++r) {
          c10::BFloat16* dst = out + (span.row_lo + r) * sh.out_stride_t + (task.kv_head * G + g) * sh.out_stride_h;
          const float inv = heads[g].run_sum[r] > 0.f ? 1.f / heads[g].run_sum[r] : 0.f;
          const __m512 scale = _mm512_set1_ps(inv);
          for (int l = 0; l < 2 * DW; ++l)
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 16 * l),
                                (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(
                                    _mm512_load_ps(heads[g].acc + r * dim + 16 * l), scale)));
        }
    }
    _tile_release();
  });
}

}  // namespace
#endif

PrefillKernel amx_prefill_kernel(int64_t dim, int64_t group) {
#if defined(LMISERVE_AMX)
  if (!lmiserve_linear::amx_usable()) return nullptr;
  if (dim == 64) return for_count<8>(group, [](auto g) -> PrefillKernel { return &prefill_tasks<g(), 2>; });
  if (dim == 128) return for_count<8>(group, [](auto g) -> PrefillKernel { return &prefill_tasks<g(), 4>; });
#endif
  (void)dim, (void)group;
  return nullptr;
}

}  // namespace lmiserve
