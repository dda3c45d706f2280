// Paged attention for one query token per sequence (decode), on the CPU.
//
// The KV cache of one layer is K and V, each (num_blocks, block_size, num_kv_heads, head_dim).
// Sequence b's token t lives in block block_tables[b][t / block_size], slot t % block_size.
// Query heads are grouped contiguously over KV heads (head h uses KV head h / (H / KVH)).
// Scores and the softmax are computed in fp32, reading each key and value once, straight from
// the cache: nothing is gathered or copied. The portable loop keeps a running (online) maximum;
// the AVX-512 kernel for bf16 scores a whole sequence first, then takes its softmax and values.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "bf16_vec.h"
#include "convert.h"
#include "count_dispatch.h"
#include "op_registration.h"
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
            int64_t q_stride_h, int64_t out_stride_b, int64_t out_stride_h, float scale, int64_t window,
            float softcap) {
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
              scores[qh * block_size + s] = softcap > 0.f ? softcap * std::tanh(dot / softcap) : dot;
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

// One sequence's cache rows for the heads of one task. A stretch of 16 tokens starting at a
// multiple of 16 lies in one block (block sizes are multiples of 16), its rows slot_stride apart.
struct Rows {
  const c10::BFloat16* cache;
  const int32_t* table;
  int64_t block_size, block_stride, slot_stride, head_offset;
  // token t0's row (at the task's first head); t0 + s is s * slot_stride further on
  const c10::BFloat16* stretch(int64_t t0) const {
    return cache + table[t0 / block_size] * block_stride + (t0 % block_size) * slot_stride + head_offset;
  }
};

// Decode attention over a bf16 paged cache with AVX-512, for G query heads per KV head and
// head_dim = 32 * DW, in two passes over a sequence: the scores of every key (16 at a time, the
// partial dot products of 16 keys reduced together), then one softmax over the whole row, then
// the values. The loop is bound by memory: while a stretch of 16 keys (or values) is used, the
// next stretch's cache lines are requested, a row at a time, so that loads are in flight all the
// time rather than in bursts (a burst of prefetches per block, or none, reads about half as fast).
// The stretch after a sequence's last values is the first keys of the thread's next task.
template <int G, int DW>
void decode_bf16_avx512(c10::BFloat16* out, const c10::BFloat16* q, const c10::BFloat16* k_cache,
                        const c10::BFloat16* v_cache, const int32_t* block_tables, const int32_t* seq_lens,
                        int64_t batch, int64_t kv_heads, int64_t block_size, int64_t max_blocks, int64_t q_stride_b,
                        int64_t q_stride_h, int64_t out_stride_b, int64_t out_stride_h, float scale, int64_t window,
                        float softcap) {
  constexpr int64_t dim = 32 * DW;
  constexpr int64_t kStretch = 16;
  const int64_t heads = kv_heads * G;
  const int64_t slot_stride = kv_heads * dim;
  const int64_t block_stride = block_size * slot_stride;
  int64_t longest = 0;
  for (int64_t b = 0; b < batch; ++b) longest = std::max<int64_t>(longest, seq_lens[b]);
  const int64_t row = longest + 2 * kStretch;  // scores of one query head, from a stretch boundary
  const Tasks tasks(batch, kv_heads);

  // the keys (or values) of task `task` a pass reads, from stretch `first` on
  auto rows_of = [&](const c10::BFloat16* cache, int64_t task) {
    const int64_t b = tasks.sequence(task);
    return Rows{cache, block_tables + b * max_blocks, block_size, block_stride, slot_stride,
                tasks.first_head(task) * dim};
  };
  auto first_key = [&](int64_t b) {
    const int64_t len = seq_lens[b];
    return ((window > 0 ? std::max<int64_t>(0, len - window) : 0) / kStretch) * kStretch;
  };
  // the rows read one stretch ahead: `count` rows from `first`, `bytes` each
  struct Ahead {
    const char* first = nullptr;
    int64_t count = 0, heads = 0;
  };

  lmiserve::for_each_task(tasks.count(batch), [&](const auto& next) {
    std::vector<float> scores(heads * row), acc(heads * dim), inv(heads);
    const __m512 lowest = _mm512_set1_ps(kLowest);
    int64_t task = next();
    while (task >= 0) {
      const int64_t upcoming = next();
      const int64_t b = tasks.sequence(task);
      const int64_t h0 = tasks.first_head(task), h1 = h0 + tasks.heads_per_task;
      const int64_t nheads = h1 - h0;
      const int64_t len = seq_lens[b];
      const int64_t first = window > 0 ? std::max<int64_t>(0, len - window) : 0;
      const int64_t base = first_key(b);
      const int64_t stretches = (len - base + kStretch - 1) / kStretch;
      const Rows keys = rows_of(k_cache, task), values = rows_of(v_cache, task);
      // what is read one stretch after stretch i of the key pass (i < stretches) or the value
      // pass (i >= stretches): the pass's next stretch, then the values, then the next task's keys
      auto ahead_of = [&](int64_t i) {
        const int64_t j = i + 1;
        Ahead a;
        if (j < 2 * stretches) {
          const int64_t t0 = base + (j % stretches) * kStretch;
          a.first = reinterpret_cast<const char*>((j < stretches ? keys : values).stretch(t0));
          a.count = std::min(kStretch, len - t0);
          a.heads = nheads;
        } else if (upcoming >= 0) {
          const int64_t nb = tasks.sequence(upcoming), t0 = first_key(nb);
          a.first = reinterpret_cast<const char*>(rows_of(k_cache, upcoming).stretch(t0));
          a.count = std::min(kStretch, seq_lens[nb] - t0);
          a.heads = tasks.heads_per_task;
        }
        return a;
      };
      // stretch i's first token, and the lanes [lo, hi) of it that the query sees
      struct Span {
        int64_t t0;
        int lo, hi;
      };
      auto span_of = [&](int64_t i) {
        const int64_t t0 = base + i * kStretch;
        return Span{t0, static_cast<int>(std::max(t0, first) - t0),
                    static_cast<int>(std::min(t0 + kStretch, len) - t0)};
      };
      // row s of that stretch, the part of head h (spread over the heads' loops, not in bursts)
      auto prefetch_row = [&](const Ahead& a, int s, int64_t h) {
        if (s >= a.count || h >= a.heads) return;
        const char* p = a.first + (s * slot_stride + h * dim) * 2;
        for (int w = 0; w < DW; ++w) _mm_prefetch(p + 64 * w, _MM_HINT_T0);
      };
      // row s of a stretch (`rows`: its first row), head h's part, as 2 DW vectors of even and odd
      // elements; the row of the stretch `ahead` asked for on the way
      auto split_row = [&](const c10::BFloat16* rows, const Ahead& ahead, int s, int64_t h, __m512* out) {
        prefetch_row(ahead, s, h - h0);
        const c10::BFloat16* r = rows + s * slot_stride + (h - h0) * dim;
        for (int w = 0; w < DW; ++w) lmiserve::split_bf16(r + 32 * w, out[2 * w], out[2 * w + 1]);
      };

      // pass 1: every score, scaled; lanes before `first` or past the end hold kLowest
      for (int64_t i = 0; i < stretches; ++i) {
        const auto [t0, lo, hi] = span_of(i);
        const __mmask16 live = static_cast<__mmask16>(((1u << hi) - 1u) & ~((1u << lo) - 1u));
        const c10::BFloat16* kb = keys.stretch(t0);
        const Ahead next_rows = ahead_of(i);
        for (int64_t h = h0; h < h1; ++h) {
          __m512 qv[G][2 * DW];
          for (int g = 0; g < G; ++g)
            for (int w = 0; w < DW; ++w)
              lmiserve::split_bf16(q + b * q_stride_b + (h * G + g) * q_stride_h + 32 * w, qv[g][2 * w], qv[g][2 * w + 1]);
          __m512 part[G][16];
          for (int g = 0; g < G; ++g)
            for (int t = 0; t < 16; ++t) part[g][t] = _mm512_setzero_ps();
          for (int s = lo; s < hi; ++s) {
            __m512 kv[2 * DW];
            split_row(kb, next_rows, s, h, kv);
            for (int g = 0; g < G; ++g) {
              __m512 dot = _mm512_mul_ps(qv[g][0], kv[0]);
              for (int l = 1; l < 2 * DW; ++l) dot = _mm512_fmadd_ps(qv[g][l], kv[l], dot);
              part[g][reduce_slot(s)] = dot;
            }
          }
          for (int g = 0; g < G; ++g) {
            __m512 sc = _mm512_mul_ps(reduce16(part[g]), _mm512_set1_ps(scale));
            if (softcap > 0.f) sc = lmiserve::softcap16(sc, softcap);
            _mm512_storeu_ps(scores.data() + (h * G + g) * row + i * kStretch, _mm512_mask_blend_ps(live, lowest, sc));
          }
        }
      }
      // one softmax per query head over its whole row
      const int64_t width = stretches * kStretch;
      for (int64_t qh = h0 * G; qh < h1 * G; ++qh) {
        float* r = scores.data() + qh * row;
        __m512 m = lowest;
        for (int64_t t = 0; t < width; t += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(r + t));
        const float top = _mm512_reduce_max_ps(m);
        __m512 sum = _mm512_setzero_ps();
        for (int64_t t = 0; t < width; t += 16) {
          const __m512 e = lmiserve::exp16(_mm512_sub_ps(_mm512_loadu_ps(r + t), _mm512_set1_ps(top)));
          _mm512_storeu_ps(r + t, e);
          sum = _mm512_add_ps(sum, e);
        }
        const float total = _mm512_reduce_add_ps(sum);
        inv[qh] = total > 0.f ? 1.f / total : 0.f;
      }
      // pass 2: the probability-weighted values, kept as even and odd elements of each 32
      std::fill(acc.begin() + h0 * G * dim, acc.begin() + h1 * G * dim, 0.f);
      for (int64_t i = 0; i < stretches; ++i) {
        const auto [t0, lo, hi] = span_of(i);
        const c10::BFloat16* vb = values.stretch(t0);
        const Ahead next_rows = ahead_of(stretches + i);
        for (int64_t h = h0; h < h1; ++h) {
          __m512 a[G][2 * DW];
          for (int g = 0; g < G; ++g)
            for (int l = 0; l < 2 * DW; ++l) a[g][l] = _mm512_loadu_ps(acc.data() + (h * G + g) * dim + 16 * l);
          const float* p = scores.data() + h * G * row + i * kStretch;
          for (int s = lo; s < hi; ++s) {
            __m512 vv[2 * DW];
            split_row(vb, next_rows, s, h, vv);
            for (int g = 0; g < G; ++g) {
              const __m512 pg = _mm512_set1_ps(p[g * row + s]);
              for (int l = 0; l < 2 * DW; ++l) a[g][l] = _mm512_fmadd_ps(pg, vv[l], a[g][l]);
            }
          }
          for (int g = 0; g < G; ++g)
            for (int l = 0; l < 2 * DW; ++l) _mm512_storeu_ps(acc.data() + (h * G + g) * dim + 16 * l, a[g][l]);
        }
      }
      for (int64_t qh = h0 * G; qh < h1 * G; ++qh) {
        c10::BFloat16* dst = out + b * out_stride_b + qh * out_stride_h;
        const float* av = acc.data() + qh * dim;
        for (int w = 0; w < DW; ++w)
          for (int e = 0; e < 16; ++e) {
            dst[32 * w + 2 * e] = lmiserve::from_f32<c10::BFloat16>(av[32 * w + e] * inv[qh]);
            dst[32 * w + 2 * e + 1] = lmiserve::from_f32<c10::BFloat16>(av[32 * w + 16 + e] * inv[qh]);
          }
      }
      task = upcoming;
    }
  });
}

using Bf16Kernel = void (*)(c10::BFloat16*, const c10::BFloat16*, const c10::BFloat16*, const c10::BFloat16*,
                            const int32_t*, const int32_t*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                            int64_t, int64_t, float, int64_t, float);

// G query heads per KV head, 1 to 8; nullptr past 8
template <int DW>
Bf16Kernel pick_group(int64_t group) {
  return lmiserve::for_count<8>(group, [](auto g) -> Bf16Kernel { return &decode_bf16_avx512<g(), DW>; });
}

Bf16Kernel pick_bf16_kernel(int64_t group, int64_t dim, int64_t block_size) {
  if (block_size % 16 != 0) return nullptr;
  if (dim == 64) return pick_group<2>(group);
  if (dim == 128) return pick_group<4>(group);
  return nullptr;
}
#endif

at::Tensor paged_attention_decode(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& block_tables, const at::Tensor& seq_lens, double scale,
                                  int64_t window, double softcap) {
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
             block_size, tables.size(1), q.stride(0), q.stride(1), out.stride(0), out.stride(1),
             static_cast<float>(scale), window, static_cast<float>(softcap));
      return out;
    }
  }
#endif
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "paged_attention_decode", [&] {
    decode<scalar_t>(out.data_ptr<scalar_t>(), q.data_ptr<scalar_t>(), k_cache.data_ptr<scalar_t>(),
                     v_cache.data_ptr<scalar_t>(), tables.data_ptr<int32_t>(), lens.data_ptr<int32_t>(), batch,
                     heads, kv_heads, dim, block_size, tables.size(1), q.stride(0), q.stride(1), out.stride(0),
                     out.stride(1), static_cast<float>(scale), window, static_cast<float>(softcap));
  });
  return out;
}
LMISERVE_OP(paged_attention_decode, "(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
                                    "Tensor seq_lens, float scale, int window, float softcap=0.0) -> Tensor");

}  // namespace
