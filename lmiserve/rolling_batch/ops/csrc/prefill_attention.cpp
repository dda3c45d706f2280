// Paged attention for prompt chunks (prefill), on the CPU.
//
// q is (T, H, D): sequence s owns rows cu_q_lens[s] .. cu_q_lens[s+1], the last n positions of
// its seq_lens[s] tokens, whose keys and values are already in the paged cache (the layout of
// paged_attention.cpp). Row r of a chunk sits at position seq_len - n + r and sees the keys at
// positions <= its own (and, with a window, the last `window` of them).
//
// One task is a tile of up to kRows rows of one sequence and one KV head, with the G query
// heads that share that KV head: each cache block of 16 tokens is converted to fp32 once per
// task (keys transposed, so 16 scores come out of one vector per query) and serves all
// kRows x G queries. Scores, the softmax (online, with a running maximum) and the sums are fp32.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "bf16_lanes.h"
#include "convert.h"
#include "op_registration.h"
#include "prefill_task.h"
#include "task_queue.h"

namespace {

constexpr int64_t kBlock = 16;  // tokens per step of the key loop (any cache block size works)
constexpr int64_t kRows = lmiserve::kPrefillRows;  // query rows per task
constexpr float kLowest = -1e30f;  // finite: the kernel is built with -ffast-math

using Task = lmiserve::PrefillTask;

struct Stretch {
  int64_t t0, width, pos0, window;  // keys t0 .. t0+width-1; query row r sits at pos0 + r
  float scale;
  int64_t dim, group;
  float softcap;
  // the keys row r sees in this stretch: t0+lo .. t0+hi-1 (none when hi <= lo)
  void bounds(int64_t r, int64_t& lo, int64_t& hi) const {
    const int64_t pos = pos0 + r;
    lo = std::max<int64_t>(window > 0 ? pos - window + 1 : 0, t0) - t0;
    hi = std::min<int64_t>(pos + 1 - t0, width);
  }
};

// Online softmax over one stretch: sc[lo..hi) (scaled scores) become exp(score - new maximum),
// the other lanes 0; query qi's running maximum and sum move on. Returns the factor by which
// the sums accumulated so far must be rescaled.
inline float softmax_step(int64_t qi, float* sc, int64_t lo, int64_t hi, float* run_max, float* run_sum,
                          float softcap) {
  if (softcap > 0.f)
    for (int64_t s = lo; s < hi; ++s) sc[s] = softcap * std::tanh(sc[s] / softcap);
  float block_max = run_max[qi];
  for (int64_t s = lo; s < hi; ++s) block_max = std::max(block_max, sc[s]);
#pragma omp simd
  for (int64_t s = 0; s < kBlock; ++s) sc[s] = (s >= lo && s < hi) ? std::exp(sc[s] - block_max) : 0.f;
  float sum = 0.f;
  for (int64_t s = lo; s < hi; ++s) sum += sc[s];
  const float correction = std::exp(run_max[qi] - block_max);
  run_sum[qi] = run_sum[qi] * correction + sum;
  run_max[qi] = block_max;
  return correction;
}

// The online-softmax update of query qi with its scores sc[lo..hi) (scaled), then acc += p V.
inline void update(const Stretch& st, int64_t qi, float* sc, int64_t lo, int64_t hi, const float* vf, float* acc,
                   float* run_max, float* run_sum) {
  const int64_t dim = st.dim;
  const float correction = softmax_step(qi, sc, lo, hi, run_max, run_sum, st.softcap);
  float* av = acc + qi * dim;
#pragma omp simd
  for (int64_t d = 0; d < dim; ++d) av[d] *= correction;
  for (int64_t s = lo; s < hi; ++s) {
    const float p = sc[s];
    const float* vs = vf + s * dim;
#pragma omp simd
    for (int64_t d = 0; d < dim; ++d) av[d] += p * vs[d];
  }
}

// Portable: one query at a time.
inline void attend(const Stretch& st, int64_t rows, const float* qf, const float* kt, const float* vf, float* acc,
                   float* run_max, float* run_sum) {
  alignas(64) float sc[kBlock];
  for (int64_t r = 0; r < rows; ++r) {
    int64_t lo, hi;
    st.bounds(r, lo, hi);
    if (hi <= lo) continue;
    for (int64_t g = 0; g < st.group; ++g) {
      const int64_t qi = r * st.group + g;
      const float* qv = qf + qi * st.dim;
      for (int64_t s = 0; s < kBlock; ++s) {
        float dot = 0.f;
        for (int64_t d = 0; d < st.dim; ++d) dot += qv[d] * kt[d * kBlock + s];
        sc[s] = dot * st.scale;
      }
      update(st, qi, sc, lo, hi, vf, acc, run_max, run_sum);
    }
  }
}

#if defined(LMISERVE_BF16_LANES)
// The softmax update of query qi as in `update`, with its DV vectors of sums in registers.
template <int DV>
inline void update_lanes(const Stretch& st, int64_t qi, float* sc, int64_t lo, int64_t hi, const float* vf,
                         float* acc, float* run_max, float* run_sum) {
  using L = lmiserve::Bf16Lanes;
  constexpr int64_t dim = L::kWidth * DV;
  const float correction = softmax_step(qi, sc, lo, hi, run_max, run_sum, st.softcap);
  float* av = acc + qi * dim;
  const L::V c = L::set1(correction);
  L::V a[DV];
  for (int l = 0; l < DV; ++l) a[l] = L::mul(L::load_f32(av + L::kWidth * l), c);
  for (int64_t s = lo; s < hi; ++s) {
    const L::V p = L::set1(sc[s]);
    const float* vs = vf + s * dim;
    for (int l = 0; l < DV; ++l) a[l] = L::fmadd(p, L::load_f32(vs + L::kWidth * l), a[l]);
  }
  for (int l = 0; l < DV; ++l) L::store_f32(av + L::kWidth * l, a[l]);
}
#endif

#if defined(LMISERVE_BF16_LANES)
// Four queries at a time: four independent chains of fused multiply-adds build their 16 scores
// each (in 16 / L::kWidth vectors) from the transposed keys (the vectors of one dimension's keys
// shared by the four), one FMA per dimension and vector, in the order of the dimensions.
template <int DV>
void attend_lanes(const Stretch& st, int64_t count, const float* qf, const float* kt, const float* vf, float* acc,
                  float* run_max, float* run_sum) {
  using L = lmiserve::Bf16Lanes;
  constexpr int64_t dim = L::kWidth * DV, nv = kBlock / L::kWidth;
  alignas(64) float sc[4][kBlock];
  const L::V scale = L::set1(st.scale);
  for (int64_t q0 = 0; q0 < count; q0 += 4) {  // qf has room past `count` up to a multiple of 4 (unused results)
    const float* q = qf + q0 * dim;
    L::V dots[4][nv];
    for (int j = 0; j < 4; ++j)
      for (int v = 0; v < nv; ++v) dots[j][v] = L::zero();
    for (int64_t d = 0; d < dim; ++d) {
      L::V kd[nv];
      for (int v = 0; v < nv; ++v) kd[v] = L::load_f32(kt + d * kBlock + v * L::kWidth);
      for (int j = 0; j < 4; ++j) {
        const L::V x = L::set1(q[j * dim + d]);
        for (int v = 0; v < nv; ++v) dots[j][v] = L::fmadd(x, kd[v], dots[j][v]);
      }
    }
    for (int j = 0; j < 4; ++j)
      for (int v = 0; v < nv; ++v) L::store_f32(sc[j] + v * L::kWidth, L::mul(dots[j][v], scale));
    for (int j = 0; j < 4 && q0 + j < count; ++j) {
      int64_t lo, hi;
      st.bounds((q0 + j) / st.group, lo, hi);
      if (hi > lo) update_lanes<DV>(st, q0 + j, sc[j], lo, hi, vf, acc, run_max, run_sum);
    }
  }
}
#endif

template <typename scalar_t>
void prefill(scalar_t* out, const scalar_t* q, const scalar_t* k_cache, const scalar_t* v_cache,
             const int32_t* block_tables, const int32_t* cu_q_lens, const int32_t* seq_lens,
             const std::vector<Task>& tasks, const lmiserve::PrefillShape& sh) {
  const int64_t dim = sh.dim, group = sh.heads / sh.kv_heads, block_size = sh.block_size;
  const int64_t slot_stride = sh.kv_heads * dim;
  const int64_t queries = kRows * group;

  lmiserve::for_each_task(static_cast<int64_t>(tasks.size()), [&](const auto& next) {
    std::vector<float> qf((queries + 3) * dim, 0.f), acc(queries * dim), run_max(queries), run_sum(queries);
    std::vector<float> kt(dim * kBlock), vf(kBlock * dim);
    for (int64_t i; (i = next()) >= 0;) {
      const Task& task = tasks[i];
      const lmiserve::TaskRows span = lmiserve::task_rows(task, cu_q_lens, seq_lens, block_tables, sh.max_blocks, sh.window);
      const int64_t row_lo = span.row_lo, pos0 = span.pos0, len = span.len;
      const int32_t* table = span.table;
      const int64_t count = task.rows * group;
      // query (r, g) is row r, head kv_head * group + g
      for (int64_t r = 0; r < task.rows; ++r) {
        for (int64_t g = 0; g < group; ++g) {
          const int64_t qi = r * group + g;
          const scalar_t* src = q + (row_lo + r) * sh.q_stride_t + (task.kv_head * group + g) * sh.q_stride_h;
          for (int64_t d = 0; d < dim; ++d) qf[qi * dim + d] = lmiserve::to_f32(src[d]);
          run_max[qi] = kLowest;
          run_sum[qi] = 0.f;
        }
      }
      std::fill(acc.begin(), acc.begin() + count * dim, 0.f);
      for (int64_t t0 = (span.first_key / kBlock) * kBlock; t0 <= span.last_key; t0 += kBlock) {
        const int64_t width = std::min<int64_t>(kBlock, len - t0);
        // this stretch of keys and values as fp32: keys transposed (dim, 16), values (16, dim)
        for (int64_t s = 0; s < kBlock; ++s) {
          const int64_t t = t0 + s;
          if (s < width) {
            const int64_t slot = static_cast<int64_t>(table[t / block_size]) * block_size + t % block_size;
            const scalar_t* kr = k_cache + slot * slot_stride + task.kv_head * dim;
            const scalar_t* vr = v_cache + slot * slot_stride + task.kv_head * dim;
            for (int64_t d = 0; d < dim; ++d) {
              kt[d * kBlock + s] = lmiserve::to_f32(kr[d]);
              vf[s * dim + d] = lmiserve::to_f32(vr[d]);
            }
          } else {
            for (int64_t d = 0; d < dim; ++d) {
              kt[d * kBlock + s] = 0.f;
              vf[s * dim + d] = 0.f;
            }
          }
        }
        const Stretch stretch{t0, width, pos0, sh.window, sh.scale, dim, group, sh.softcap};
#if defined(LMISERVE_BF16_LANES)
        if (dim == 64 || dim == 128) {
          constexpr int w = lmiserve::Bf16Lanes::kWidth;
          (dim == 64 ? attend_lanes<64 / w> : attend_lanes<128 / w>)(stretch, count, qf.data(), kt.data(), vf.data(),
                                                                    acc.data(), run_max.data(), run_sum.data());
          continue;
        }
#endif
        attend(stretch, task.rows, qf.data(), kt.data(), vf.data(), acc.data(), run_max.data(), run_sum.data());
      }
      for (int64_t r = 0; r < task.rows; ++r) {
        for (int64_t g = 0; g < group; ++g) {
          const int64_t qi = r * group + g;
          scalar_t* dst = out + (row_lo + r) * sh.out_stride_t + (task.kv_head * group + g) * sh.out_stride_h;
          const float inv = run_sum[qi] > 0.f ? 1.f / run_sum[qi] : 0.f;
          const float* av = acc.data() + qi * dim;
          for (int64_t d = 0; d < dim; ++d) dst[d] = lmiserve::from_f32<scalar_t>(av[d] * inv);
        }
      }
    }
  });
}

at::Tensor paged_attention_prefill(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                   const at::Tensor& block_tables, const at::Tensor& cu_q_lens,
                                   const at::Tensor& seq_lens, double scale, int64_t window, double softcap,
                                   bool tiles) {
  TORCH_CHECK(q.dim() == 3 && q.stride(2) == 1, "q must be (tokens, heads, head_dim), its last dimension contiguous");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.is_contiguous() && v_cache.is_contiguous(),
              "caches must be contiguous (blocks, block_size, kv_heads, head_dim)");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && cu_q_lens.scalar_type() == at::kInt &&
                  seq_lens.scalar_type() == at::kInt,
              "block_tables, cu_q_lens and seq_lens must be int32");
  TORCH_CHECK(q.scalar_type() == k_cache.scalar_type(), "q and the cache must share a dtype");
  const auto tables = block_tables.contiguous();
  const auto cu = cu_q_lens.contiguous();
  const auto lens = seq_lens.contiguous();
  const int64_t heads = q.size(1), dim = q.size(2);
  const int64_t block_size = k_cache.size(1), kv_heads = k_cache.size(2);
  TORCH_CHECK(k_cache.size(3) == dim && heads % kv_heads == 0, "head shapes do not match");
  const int64_t sequences = lens.size(0);
  TORCH_CHECK(cu.size(0) == sequences + 1 && tables.size(0) >= sequences, "one row of cu_q_lens per sequence, plus one");
  const int32_t* cu_p = cu.data_ptr<int32_t>();
  const int32_t* len_p = lens.data_ptr<int32_t>();
  std::vector<Task> tasks;
  for (int64_t s = 0; s < sequences; ++s) {
    const int64_t n = cu_p[s + 1] - cu_p[s];
    TORCH_CHECK(n >= 0 && n <= len_p[s], "a chunk longer than its sequence");
    for (int64_t h = 0; h < kv_heads; ++h)
      for (int64_t r = 0; r < n; r += kRows) tasks.push_back({s, h, r, std::min(kRows, n - r)});
  }
  auto out = at::empty_like(q);
  const lmiserve::PrefillShape shape{heads,       kv_heads,      dim,           block_size,
                                     tables.size(1), q.stride(0), q.stride(1), out.stride(0),
                                     out.stride(1),  static_cast<float>(scale), window,
                                     static_cast<float>(softcap)};
  // the costliest first (keys read x rows), so that the last tasks taken are short ones
  auto cost = [&](const Task& t) {
    return (lmiserve::task_rows(t, cu_p, len_p, tables.data_ptr<int32_t>(), shape.max_blocks, window).last_key + 1) *
           t.rows;
  };
  std::stable_sort(tasks.begin(), tasks.end(), [&](const Task& a, const Task& b) { return cost(a) > cost(b); });
  if (q.scalar_type() == at::kBFloat16 && block_size % 16 == 0) {
    const int64_t group = heads / kv_heads;
    lmiserve::PrefillKernel kernel = tiles ? lmiserve::amx_prefill_kernel(dim, group) : nullptr;
    if (kernel == nullptr) kernel = lmiserve::bf16_prefill_kernel(dim, group);
    if (kernel != nullptr) {
      kernel(out.data_ptr<c10::BFloat16>(), q.data_ptr<c10::BFloat16>(), k_cache.data_ptr<c10::BFloat16>(),
             v_cache.data_ptr<c10::BFloat16>(), tables.data_ptr<int32_t>(), cu_p, len_p, tasks, shape);
      return out;
    }
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "paged_attention_prefill", [&] {
    prefill<scalar_t>(out.data_ptr<scalar_t>(), q.data_ptr<scalar_t>(), k_cache.data_ptr<scalar_t>(),
                      v_cache.data_ptr<scalar_t>(), tables.data_ptr<int32_t>(), cu_p, len_p, tasks, shape);
  });
  return out;
}
LMISERVE_OP(paged_attention_prefill, "(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
                                     "Tensor cu_q_lens, Tensor seq_lens, float scale, int window, "
                                     "float softcap=0.0, bool tiles=False) -> Tensor");

}  // namespace
