// Paged prefill attention for bf16 caches on CPUs with AVX512_BF16 (the task split, the
// causal bounds and the output are those of prefill_attention.cpp, which calls this).
//
// A task's queries (up to 16 rows x the G query heads of one KV head) go over the keys 16 at
// a time. Each stretch of 16 keys is transposed once into pairs of dimensions (one vector of
// 16 keys per pair), so a query's 16 scores are head_dim / 2 vdpbf16ps against a broadcast
// pair of its own values: exact products of bf16, summed in fp32. The values are widened to
// fp32 once per stretch (even and odd elements) and the probabilities stay fp32, as in the
// portable path; the softmax is online (a running maximum per query), 16 lanes at a time.
// Several queries share every load of keys and values.

#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

#include "bf16_vec.h"
#include "convert.h"
#include "count_dispatch.h"
#include "prefill_task.h"
#include "task_queue.h"

namespace lmiserve {

#if defined(__AVX512BF16__)
namespace {

constexpr float kLowest = -1e30f;  // finite: the kernels are built with -ffast-math

// One stretch of 16 keys: keys as pairs of dimensions (pairs vectors of 16 keys), values as fp32.
struct Stretch {
  const __m512i* kt;
  const __m512* vf;
  int64_t t0;
  int width;
  int64_t pos0, window;
  __m512 scale;
  float softcap;  // 0: scores not capped
};

// NB queries (numbered q0.. in the task, query qi at row qi / G) over one stretch: their scores,
// the online-softmax update and acc += probabilities x values, every load shared by the NB.
template <int G, int DW, int NB>
inline void attend(const Stretch& st, const int32_t* const* qrow, int64_t q0, float* acc, float* run_max,
                   float* run_sum) {
  constexpr int64_t dim = 32 * DW, pairs = 16 * DW, widths = 2 * DW;
  const __m512 lowest = _mm512_set1_ps(kLowest);
  __m512 s0[NB], s1[NB];  // two chains of products per query, over half of the pairs each
  for (int j = 0; j < NB; ++j) s0[j] = s1[j] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; p += 2) {
    const __m512bh k0 = (__m512bh)st.kt[p], k1 = (__m512bh)st.kt[p + 1];
    for (int j = 0; j < NB; ++j) {
      s0[j] = _mm512_dpbf16_ps(s0[j], (__m512bh)_mm512_set1_epi32(qrow[j][p]), k0);
      s1[j] = _mm512_dpbf16_ps(s1[j], (__m512bh)_mm512_set1_epi32(qrow[j][p + 1]), k1);
    }
  }
  // the online-softmax update, each stage for all NB queries at once (independent chains)
  __m512 sc[NB], e[NB];
  __mmask16 live[NB];
  alignas(64) float shift[16] = {0.f};  // old maximum - new maximum, per query
  float top[NB];
  for (int j = 0; j < NB; ++j) {
    const int64_t pos = st.pos0 + (q0 + j) / G;
    const int64_t lo = std::max<int64_t>(st.window > 0 ? pos - st.window + 1 - st.t0 : 0, 0);
    const int64_t hi = std::min<int64_t>(pos + 1 - st.t0, st.width);
    live[j] = hi > lo ? static_cast<__mmask16>(((1u << hi) - 1u) & ~((1u << lo) - 1u)) : static_cast<__mmask16>(0);
    __m512 scaled = _mm512_mul_ps(_mm512_add_ps(s0[j], s1[j]), st.scale);
    if (st.softcap > 0.f) scaled = softcap16(scaled, st.softcap);
    sc[j] = _mm512_mask_blend_ps(live[j], lowest, scaled);
  }
  for (int j = 0; j < NB; ++j) {
    top[j] = std::max(run_max[q0 + j], _mm512_reduce_max_ps(sc[j]));
    shift[j] = run_max[q0 + j] - top[j];
  }
  for (int j = 0; j < NB; ++j) e[j] = _mm512_maskz_mov_ps(live[j], exp16(_mm512_sub_ps(sc[j], _mm512_set1_ps(top[j]))));
  alignas(64) float corr_of[16];
  _mm512_store_ps(corr_of, exp16(_mm512_load_ps(shift)));
  alignas(64) float prob[NB][16];
  __m512 corr[NB];
  for (int j = 0; j < NB; ++j) {
    _mm512_store_ps(prob[j], e[j]);
    corr[j] = _mm512_set1_ps(corr_of[j]);
    run_sum[q0 + j] = run_sum[q0 + j] * corr_of[j] + _mm512_reduce_add_ps(e[j]);
    run_max[q0 + j] = top[j];
  }
  __m512 a[NB][widths];
  for (int j = 0; j < NB; ++j)
    for (int l = 0; l < widths; ++l) a[j][l] = _mm512_mul_ps(_mm512_loadu_ps(acc + (q0 + j) * dim + 16 * l), corr[j]);
  for (int k = 0; k < st.width; ++k) {
    __m512 pk[NB];
    for (int j = 0; j < NB; ++j) pk[j] = _mm512_set1_ps(prob[j][k]);
    for (int l = 0; l < widths; ++l) {
      const __m512 v = st.vf[k * widths + l];
      for (int j = 0; j < NB; ++j) a[j][l] = _mm512_fmadd_ps(pk[j], v, a[j][l]);
    }
  }
  for (int j = 0; j < NB; ++j)
    for (int l = 0; l < widths; ++l) _mm512_storeu_ps(acc + (q0 + j) * dim + 16 * l, a[j][l]);
}

// G query heads per KV head, head_dim = 32 * DW, QB queries at a time.
template <int G, int DW, int QB>
void prefill_tasks(c10::BFloat16* out, const c10::BFloat16* q, const c10::BFloat16* k_cache,
                   const c10::BFloat16* v_cache, const int32_t* block_tables, const int32_t* cu_q_lens,
                   const int32_t* seq_lens, const std::vector<PrefillTask>& tasks, const PrefillShape& sh) {
  constexpr int64_t dim = 32 * DW, pairs = 16 * DW, widths = 2 * DW;  // fp32 vectors per row
  const int64_t slot_stride = sh.kv_heads * dim;
  const int64_t max_queries = kPrefillRows * G;
  const __m512 scale = _mm512_set1_ps(sh.scale);

  for_each_task(static_cast<int64_t>(tasks.size()), [&](const auto& next) {
    std::vector<float> acc(max_queries * dim), run_max(max_queries), run_sum(max_queries);
    std::vector<__m512i> kt(pairs);
    std::vector<__m512> vf(16 * widths);
    for (int64_t i; (i = next()) >= 0;) {
      const PrefillTask& task = tasks[i];
      const TaskRows span = task_rows(task, cu_q_lens, seq_lens, block_tables, sh.max_blocks, sh.window);
      const int64_t row_lo = span.row_lo, pos0 = span.pos0, len = span.len;
      const int32_t* table = span.table;
      const int64_t count = task.rows * G;  // query (r, g) is r * G + g
      const int32_t* qrow[kPrefillRows * G];
      for (int64_t qi = 0; qi < count; ++qi) {
        qrow[qi] = reinterpret_cast<const int32_t*>(q + (row_lo + qi / G) * sh.q_stride_t +
                                                    (task.kv_head * G + qi % G) * sh.q_stride_h);
        run_max[qi] = kLowest;
        run_sum[qi] = 0.f;
      }
      std::fill(acc.begin(), acc.begin() + count * dim, 0.f);
      for (int64_t t0 = (span.first_key / 16) * 16; t0 <= span.last_key; t0 += 16) {
        const int width = static_cast<int>(std::min<int64_t>(16, len - t0));
        const int64_t slot0 = static_cast<int64_t>(table[t0 / sh.block_size]) * sh.block_size + t0 % sh.block_size;
        const c10::BFloat16* kb = k_cache + slot0 * slot_stride + task.kv_head * dim;
        const c10::BFloat16* vb = v_cache + slot0 * slot_stride + task.kv_head * dim;
        // keys as pairs of dimensions x 16 keys; values as fp32 (keys past the end: zeros)
        for (int w = 0; w < DW; ++w) {
          __m512i* block = kt.data() + 16 * w;
          for (int k = 0; k < 16; ++k)
            block[k] = k < width ? _mm512_loadu_si512(kb + k * slot_stride + 32 * w) : _mm512_setzero_si512();
          transpose16(block);
        }
        for (int k = 0; k < 16; ++k)
          for (int w = 0; w < DW; ++w) {
            if (k < width) {
              split_bf16(vb + k * slot_stride + 32 * w, vf[k * widths + 2 * w], vf[k * widths + 2 * w + 1]);
            } else {
              vf[k * widths + 2 * w] = vf[k * widths + 2 * w + 1] = _mm512_setzero_ps();
            }
          }

        const Stretch st{kt.data(), vf.data(), t0, width, pos0, sh.window, scale, sh.softcap};
        int64_t q0 = 0;
        for (; q0 + QB <= count; q0 += QB) attend<G, DW, QB>(st, qrow + q0, q0, acc.data(), run_max.data(), run_sum.data());
        switch (count - q0) {  // the last queries, fewer than QB
          case 1: attend<G, DW, 1>(st, qrow + q0, q0, acc.data(), run_max.data(), run_sum.data()); break;
          case 2: attend<G, DW, 2>(st, qrow + q0, q0, acc.data(), run_max.data(), run_sum.data()); break;
          case 3: attend<G, DW, 3>(st, qrow + q0, q0, acc.data(), run_max.data(), run_sum.data()); break;
          default: break;
        }
      }
      // out = acc / sum, the even and odd elements of each 32 interleaved back
      for (int64_t qi = 0; qi < count; ++qi) {
        c10::BFloat16* dst = out + (row_lo + qi / G) * sh.out_stride_t + (task.kv_head * G + qi % G) * sh.out_stride_h;
        const float inv = run_sum[qi] > 0.f ? 1.f / run_sum[qi] : 0.f;
        const float* av = acc.data() + qi * dim;
        for (int w = 0; w < DW; ++w)
          for (int e = 0; e < 16; ++e) {
            dst[32 * w + 2 * e] = from_f32<c10::BFloat16>(av[32 * w + e] * inv);
            dst[32 * w + 2 * e + 1] = from_f32<c10::BFloat16>(av[32 * w + 16 + e] * inv);
          }
      }
    }
  });
}

}  // namespace
#endif

PrefillKernel bf16_prefill_kernel(int64_t dim, int64_t group) {
#if defined(__AVX512BF16__)
  if (dim == 64) return for_count<8>(group, [](auto g) -> PrefillKernel { return &prefill_tasks<g(), 2, 4>; });
  if (dim == 128) return for_count<8>(group, [](auto g) -> PrefillKernel { return &prefill_tasks<g(), 4, 2>; });
#endif
  (void)dim, (void)group;
  return nullptr;
}

}  // namespace lmiserve
