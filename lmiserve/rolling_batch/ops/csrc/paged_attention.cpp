// Paged attention for one query token per sequence (decode), on the CPU.
//
// The KV cache of one layer is K and V, each (num_blocks, block_size, num_kv_heads, head_dim).
// Sequence b's token t lives in block block_tables[b][t / block_size], slot t % block_size.
// Query heads are grouped contiguously over KV heads (head h uses KV head h / (H / KVH)).
// Scores and the softmax are computed in fp32 with a running (online) maximum, reading each
// key and value once, straight from the cache: nothing is gathered or copied.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "convert.h"
#include "task_queue.h"

namespace {

template <typename T>
inline float as_float(T v) {
  return lmiserve::to_f32(v);
}

// a finite "minus infinity": the kernel is built with -ffast-math, which assumes finite values
constexpr float kLowest = -1e30f;

// One task is a sequence and a range of its KV heads. With enough sequences a task takes
// every head, so each cache block is read front to back in one pass (what the hardware
// prefetcher likes); with few sequences the heads are split to keep every thread busy.
struct Tasks {
  int64_t splits, heads_per_task;
  Tasks(int64_t batch, int64_t kv_heads)
      : splits(batch >= 2 * at::get_num_threads() ? 1 : kv_heads), heads_per_task(kv_heads / splits) {}
  int64_t count(int64_t batch) const { return batch * splits; }
  int64_t sequence(int64_t task) const { return task / splits; }
  int64_t first_head(int64_t task) const { return (task % splits) * heads_per_task; }
};

template <typename scalar_t>
void decode(scalar_t* out, const scalar_t* q, const scalar_t* k_cache, const scalar_t* v_cache,
            const int32_t* block_tables, const int32_t* seq_lens, int64_t batch, int64_t heads,
            int64_t kv_heads, int64_t dim, int64_t block_size, int64_t max_blocks, int64_t q_stride_b,
            int64_t q_stride_h, int64_t out_stride_b, int64_t out_stride_h, float scale, int64_t window) {
  const int64_t group = heads / kv_heads;
  const int64_t slot_stride = kv_heads * dim;
  const int64_t block_stride = block_size * slot_stride;
  const Tasks tasks(batch, kv_heads);

  lmiserve::for_each_task(tasks.count(batch), [&](const auto& next) {
    std::vector<float> qf(heads * dim), acc(heads * dim);
    std::vector<float> run_max(heads), run_sum(heads), scores(heads * block_size);
    for (int64_t task; (task = next()) >= 0;) {
      const int64_t b = tasks.sequence(task);
      const int64_t h0 = tasks.first_head(task), h1 = h0 + tasks.heads_per_task;
      const int64_t len = seq_lens[b];
      const int64_t first = window > 0 ? std::max<int64_t>(0, len - window) : 0;
      for (int64_t qh = h0 * group; qh < h1 * group; ++qh) {
        const scalar_t* src = q + b * q_stride_b + qh * q_stride_h;
        for (int64_t d = 0; d < dim; ++d) qf[qh * dim + d] = as_float(src[d]) * scale;
        run_max[qh] = kLowest;
        run_sum[qh] = 0.f;
      }
      std::fill(acc.begin() + h0 * group * dim, acc.begin() + h1 * group * dim, 0.f);
      const int32_t* table = block_tables + b * max_blocks;

      for (int64_t t0 = (first / block_size) * block_size; t0 < len; t0 += block_size) {
        const int64_t block = table[t0 / block_size];
        const int64_t lo = std::max(t0, first) - t0;
        const int64_t hi = std::min(t0 + block_size, len) - t0;
        const scalar_t* kb = k_cache + block * block_stride;
        const scalar_t* vb = v_cache + block * block_stride;
        // scores of every query head against the block's keys, reading the block in order
        for (int64_t s = lo; s < hi; ++s) {
          for (int64_t h = h0; h < h1; ++h) {
            const scalar_t* kr = kb + s * slot_stride + h * dim;
            for (int64_t g = 0; g < group; ++g) {
              const int64_t qh = h * group + g;
              const float* qv = qf.data() + qh * dim;
              float dot = 0.f;
#pragma omp simd reduction(+ : dot)
              for (int64_t d = 0; d < dim; ++d) dot += qv[d] * as_float(kr[d]);
              scores[qh * block_size + s] = dot;
            }
          }
        }
        // online softmax: rescale what was accumulated when the running maximum grows
        for (int64_t qh = h0 * group; qh < h1 * group; ++qh) {
          float* sc = scores.data() + qh * block_size;
          float block_max = run_max[qh];
          for (int64_t s = lo; s < hi; ++s) block_max = std::max(block_max, sc[s]);
          float sum = 0.f;
#pragma omp simd reduction(+ : sum)
          for (int64_t s = lo; s < hi; ++s) {
            sc[s] = std::exp(sc[s] - block_max);
            sum += sc[s];
          }
          const float correction = std::exp(run_max[qh] - block_max);
          run_sum[qh] = run_sum[qh] * correction + sum;
          run_max[qh] = block_max;
          float* av = acc.data() + qh * dim;
#pragma omp simd
          for (int64_t d = 0; d < dim; ++d) av[d] *= correction;
        }
        for (int64_t s = lo; s < hi; ++s) {
          for (int64_t h = h0; h < h1; ++h) {
            const scalar_t* vr = vb + s * slot_stride + h * dim;
            for (int64_t g = 0; g < group; ++g) {
              const int64_t qh = h * group + g;
              const float p = scores[qh * block_size + s];
              float* av = acc.data() + qh * dim;
#pragma omp simd
              for (int64_t d = 0; d < dim; ++d) av[d] += p * as_float(vr[d]);
            }
          }
        }
      }
      for (int64_t qh = h0 * group; qh < h1 * group; ++qh) {
        scalar_t* dst = out + b * out_stride_b + qh * out_stride_h;
        const float inv = run_sum[qh] > 0.f ? 1.f / run_sum[qh] : 0.f;
        const float* av = acc.data() + qh * dim;
        for (int64_t d = 0; d < dim; ++d) dst[d] = lmiserve::from_f32<scalar_t>(av[d] * inv);
      }
    }
  });
}

#if defined(__AVX512F__)
#include <immintrin.h>

// 16 bf16 values -> 16 fp32 lanes
inline __m512 load_bf16(const c10::BFloat16* p) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

// Blocks are asked for 8 ahead, into L2 (T1) rather than L1: a block is 2 x 6 KiB at
// SmolLM2's shapes, and a burst of L1 prefetches that deep left the loads waiting (decode
// attention at 32 sequences x 200 tokens took ~20% longer with T0 at 4 or 8 ahead).
constexpr int64_t PREFETCH_AHEAD = 8;

inline void prefetch_block(const c10::BFloat16* k_cache, const c10::BFloat16* v_cache, int64_t offset, int64_t elements) {
  const char* k = reinterpret_cast<const char*>(k_cache + offset);
  const char* v = reinterpret_cast<const char*>(v_cache + offset);
  for (int64_t byte = 0; byte < elements * 2; byte += 64) {
    _mm_prefetch(k + byte, _MM_HINT_T1);
    _mm_prefetch(v + byte, _MM_HINT_T1);
  }
}

// Where token t's partial sums go so that reduce16 returns lane t = sum of token t's vector.
inline int reduce_slot(int t) { return 4 * (t % 4) + t / 4; }

// v[16] -> one vector whose lane t is the sum of the lanes of the vector stored at reduce_slot(t).
inline __m512 reduce16(const __m512* v) {
  __m512 a[8], b[4];
  for (int i = 0; i < 8; ++i)
    a[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  for (int j = 0; j < 4; ++j)
    b[j] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * j], a[2 * j + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(a[2 * j], a[2 * j + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 c0 = _mm512_add_ps(_mm512_unpacklo_ps(b[0], b[1]), _mm512_unpackhi_ps(b[0], b[1]));
  const __m512 c1 = _mm512_add_ps(_mm512_unpacklo_ps(b[2], b[3]), _mm512_unpackhi_ps(b[2], b[3]));
  const __m512d d0 = _mm512_castps_pd(c0), d1 = _mm512_castps_pd(c1);
  return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(d0, d1)), _mm512_castpd_ps(_mm512_unpackhi_pd(d0, d1)));
}

// Decode attention over a bf16 paged cache with AVX-512, for G query heads per KV head and
// head_dim = 16 * DV. Per block of 16 tokens: the scores of all 16 tokens are built in one
// vector (partial dot products reduced together rather than one by one), the softmax runs
// 16 lanes wide, and each KV head's accumulators stay in registers while the block's values
// are added.
template <int G, int DV>
void decode_bf16_avx512(c10::BFloat16* out, const c10::BFloat16* q, const c10::BFloat16* k_cache,
                        const c10::BFloat16* v_cache, const int32_t* block_tables, const int32_t* seq_lens,
                        int64_t batch, int64_t kv_heads, int64_t max_blocks, int64_t q_stride_b, int64_t q_stride_h,
                        int64_t out_stride_b, int64_t out_stride_h, float scale, int64_t window) {
  constexpr int64_t dim = 16 * DV;
  constexpr int64_t block_size = 16;
  const int64_t heads = kv_heads * G;
  const int64_t slot_stride = kv_heads * dim;
  const int64_t block_stride = block_size * slot_stride;
  const Tasks tasks(batch, kv_heads);

  lmiserve::for_each_task(tasks.count(batch), [&](const auto& next) {
    std::vector<float> acc(heads * dim), run_max(heads), run_sum(heads), probs(heads * block_size);
    std::vector<float> qf(heads * dim), corr(heads);
    for (int64_t task; (task = next()) >= 0;) {
      const int64_t b = tasks.sequence(task);
      const int64_t h0 = tasks.first_head(task), h1 = h0 + tasks.heads_per_task;
      const int64_t len = seq_lens[b];
      const int64_t first = window > 0 ? std::max<int64_t>(0, len - window) : 0;
      const c10::BFloat16* qb = q + b * q_stride_b;
      for (int64_t qh = h0 * G; qh < h1 * G; ++qh) {
        for (int64_t d = 0; d < dim; ++d) qf[qh * dim + d] = lmiserve::to_f32(qb[qh * q_stride_h + d]);
        run_max[qh] = kLowest;
        run_sum[qh] = 0.f;
      }
      std::fill(acc.begin() + h0 * G * dim, acc.begin() + h1 * G * dim, 0.f);
      const int32_t* table = block_tables + b * max_blocks;
      const __m512 scale_v = _mm512_set1_ps(scale);

      for (int64_t t0 = (first / block_size) * block_size; t0 < len; t0 += block_size) {
        const int64_t block = table[t0 / block_size];
        const int lo = static_cast<int>(std::max(t0, first) - t0);
        const int hi = static_cast<int>(std::min(t0 + block_size, len) - t0);
        const __mmask16 live = static_cast<__mmask16>(((1u << hi) - 1u) & ~((1u << lo) - 1u));
        const c10::BFloat16* kb = k_cache + block * block_stride;
        const c10::BFloat16* vb = v_cache + block * block_stride;
        // keep the memory system busy: ask for the block PREFETCH_AHEAD positions further on
        const int64_t ahead = t0 + PREFETCH_AHEAD * block_size;
        if (t0 == (first / block_size) * block_size) {
          for (int64_t t = t0; t < std::min(ahead, len); t += block_size) prefetch_block(k_cache, v_cache, table[t / block_size] * block_stride, block_stride);
        }
        if (ahead < len) prefetch_block(k_cache, v_cache, table[ahead / block_size] * block_stride, block_stride);
        for (int64_t h = h0; h < h1; ++h) {
          __m512 part[G][16];
          for (int g = 0; g < G; ++g)
            for (int t = 0; t < 16; ++t) part[g][t] = _mm512_setzero_ps();
          for (int s = lo; s < hi; ++s) {
            const c10::BFloat16* kr = kb + s * slot_stride + h * dim;
            __m512 kv[DV];
            for (int l = 0; l < DV; ++l) kv[l] = load_bf16(kr + 16 * l);
            for (int g = 0; g < G; ++g) {
              const float* qv = qf.data() + (h * G + g) * dim;
              __m512 dot = _mm512_mul_ps(_mm512_loadu_ps(qv), kv[0]);
              for (int l = 1; l < DV; ++l) dot = _mm512_fmadd_ps(_mm512_loadu_ps(qv + 16 * l), kv[l], dot);
              part[g][reduce_slot(s)] = dot;
            }
          }
          for (int g = 0; g < G; ++g) {
            const int64_t qh = h * G + g;
            const __m512 sc = _mm512_mul_ps(reduce16(part[g]), scale_v);
            const float block_max = std::max(run_max[qh], _mm512_mask_reduce_max_ps(live, sc));
            alignas(64) float e[16];
            _mm512_store_ps(e, _mm512_sub_ps(sc, _mm512_set1_ps(block_max)));
#pragma omp simd
            for (int t = 0; t < 16; ++t) e[t] = std::exp(e[t]);
            const __m512 p = _mm512_maskz_mov_ps(live, _mm512_load_ps(e));
            _mm512_storeu_ps(probs.data() + qh * block_size, p);
            corr[qh] = std::exp(run_max[qh] - block_max);
            run_sum[qh] = run_sum[qh] * corr[qh] + _mm512_reduce_add_ps(p);
            run_max[qh] = block_max;
          }
          __m512 a[G][DV];
          for (int g = 0; g < G; ++g) {
            const __m512 c = _mm512_set1_ps(corr[h * G + g]);
            for (int l = 0; l < DV; ++l) a[g][l] = _mm512_mul_ps(_mm512_loadu_ps(acc.data() + (h * G + g) * dim + 16 * l), c);
          }
          for (int s = lo; s < hi; ++s) {
            const c10::BFloat16* vr = vb + s * slot_stride + h * dim;
            __m512 vv[DV];
            for (int l = 0; l < DV; ++l) vv[l] = load_bf16(vr + 16 * l);
            for (int g = 0; g < G; ++g) {
              const __m512 p = _mm512_set1_ps(probs[(h * G + g) * block_size + s]);
              for (int l = 0; l < DV; ++l) a[g][l] = _mm512_fmadd_ps(p, vv[l], a[g][l]);
            }
          }
          for (int g = 0; g < G; ++g)
            for (int l = 0; l < DV; ++l) _mm512_storeu_ps(acc.data() + (h * G + g) * dim + 16 * l, a[g][l]);
        }
      }
      for (int64_t qh = h0 * G; qh < h1 * G; ++qh) {
        c10::BFloat16* dst = out + b * out_stride_b + qh * out_stride_h;
        const float inv = run_sum[qh] > 0.f ? 1.f / run_sum[qh] : 0.f;
        const float* av = acc.data() + qh * dim;
        for (int64_t d = 0; d < dim; ++d) dst[d] = lmiserve::from_f32<c10::BFloat16>(av[d] * inv);
      }
    }
  });
}

using Bf16Kernel = void (*)(c10::BFloat16*, const c10::BFloat16*, const c10::BFloat16*, const c10::BFloat16*,
                            const int32_t*, const int32_t*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                            int64_t, float, int64_t);

template <int DV>
Bf16Kernel pick_group(int64_t group) {
  switch (group) {
    case 1: return &decode_bf16_avx512<1, DV>;
    case 2: return &decode_bf16_avx512<2, DV>;
    case 3: return &decode_bf16_avx512<3, DV>;
    case 4: return &decode_bf16_avx512<4, DV>;
    case 5: return &decode_bf16_avx512<5, DV>;
    case 6: return &decode_bf16_avx512<6, DV>;
    case 7: return &decode_bf16_avx512<7, DV>;
    case 8: return &decode_bf16_avx512<8, DV>;
    default: return nullptr;
  }
}

Bf16Kernel pick_bf16_kernel(int64_t group, int64_t dim, int64_t block_size) {
  if (block_size != 16) return nullptr;
  if (dim == 64) return pick_group<4>(group);
  if (dim == 128) return pick_group<8>(group);
  return nullptr;
}
#endif

at::Tensor paged_attention_decode(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& block_tables, const at::Tensor& seq_lens, double scale,
                                  int64_t window) {
  TORCH_CHECK(q.dim() == 3, "q must be (batch, heads, head_dim)");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.is_contiguous() && v_cache.is_contiguous(),
              "caches must be contiguous (blocks, block_size, kv_heads, head_dim)");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && seq_lens.scalar_type() == at::kInt,
              "block_tables and seq_lens must be int32");
  TORCH_CHECK(q.stride(2) == 1, "q's last dimension must be contiguous");
  TORCH_CHECK(q.scalar_type() == k_cache.scalar_type(), "q and the cache must share a dtype");
  const auto tables = block_tables.contiguous();
  const auto lens = seq_lens.contiguous();
  const int64_t batch = q.size(0), heads = q.size(1), dim = q.size(2);
  const int64_t block_size = k_cache.size(1), kv_heads = k_cache.size(2);
  TORCH_CHECK(k_cache.size(3) == dim && heads % kv_heads == 0, "head shapes do not match");
  auto out = at::empty({batch, heads, dim}, q.options());
#if defined(__AVX512F__)
  if (q.scalar_type() == at::kBFloat16) {
    if (auto kernel = pick_bf16_kernel(heads / kv_heads, dim, block_size)) {
      kernel(out.data_ptr<c10::BFloat16>(), q.data_ptr<c10::BFloat16>(), k_cache.data_ptr<c10::BFloat16>(),
             v_cache.data_ptr<c10::BFloat16>(), tables.data_ptr<int32_t>(), lens.data_ptr<int32_t>(), batch, kv_heads,
             tables.size(1), q.stride(0), q.stride(1), out.stride(0), out.stride(1), static_cast<float>(scale), window);
      return out;
    }
  }
#endif
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "paged_attention_decode", [&] {
    decode<scalar_t>(out.data_ptr<scalar_t>(), q.data_ptr<scalar_t>(), k_cache.data_ptr<scalar_t>(),
                     v_cache.data_ptr<scalar_t>(), tables.data_ptr<int32_t>(), lens.data_ptr<int32_t>(), batch,
                     heads, kv_heads, dim, block_size, tables.size(1), q.stride(0), q.stride(1), out.stride(0),
                     out.stride(1), static_cast<float>(scale), window);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(lmiserve_cpu, m) {
  m.def("paged_attention_decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
        "Tensor seq_lens, float scale, int window) -> Tensor");
  m.impl("paged_attention_decode", c10::DispatchKey::CPU, &paged_attention_decode);
}
