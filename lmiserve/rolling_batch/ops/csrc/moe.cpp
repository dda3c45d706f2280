// Mixture-of-experts layer: the rows routed to each expert multiplied by its weights as one
// grouped product (rows sorted by expert), then each token's experts summed with their weights.
//
//   x (T, H), topk_weights (T, k) fp32, topk_ids (T, k) int32,
//   w13 (E, 2I, H): gate rows then up rows of each expert, w2 (E, H, I)
//   y[t] = sum_j w[t, j] * down_e(silu(gate_e(x[t])) * up_e(x[t])),  e = ids[t, j]
//
// Two passes, each parallel over (expert, tile of output columns): gate/up with the SwiGLU
// (written in x's dtype, as the model rounds it), then down (rounded to x's dtype, kept in fp32).
// Every dot product runs over its row alone in a fixed order, so a row's result never depends
// on the other rows of the step. fp32 and bf16 (AVX512_BF16 dot products where the CPU has them).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <type_traits>
#include <vector>

#include "op_registration.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

using bf16 = c10::BFloat16;

constexpr int kCols = 4;   // weight rows (output columns) a block multiplies at once
constexpr int kRows = 4;   // x rows a block multiplies at once
constexpr int kTile = 32;  // output columns of one task

#if defined(__AVX512F__)
// The vector code's steps along K: fp32 with FMAs, 16 values a step.
struct F32Steps {
  using T = float;
  using V = __m512;
  static constexpr int64_t kStep = 16;
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V load_first(const float* p, int64_t n) {  // the first n (< kStep) values, the other lanes 0
    return _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1u), p);
  }
  static __m512 add_products(__m512 acc, V x, V w) { return _mm512_fmadd_ps(x, w, acc); }
};

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
// bf16 pairs with vdpbf16ps, 32 values a step.
struct Bf16Steps {
  using T = bf16;
  using V = __m512bh;
  static constexpr int64_t kStep = 32;
  static V load(const bf16* p) { return (__m512bh)_mm512_loadu_si512(p); }
  static V load_first(const bf16* p, int64_t n) {
    return (__m512bh)_mm512_maskz_loadu_epi16(static_cast<__mmask32>((1ull << n) - 1ull), p);
  }
  static __m512 add_products(__m512 acc, V x, V w) { return _mm512_dpbf16_ps(acc, x, w); }
};
#endif

// block_dot's sums on the vector code S: lane sums over K a step at a time, the last step
// masked, then each accumulator's lanes added.
template <class S, int NR>
inline void block_dot_vector(const typename S::T* const* xs, const typename S::T* const* ws, int64_t K,
                             float out[kRows][kCols]) {
  __m512 acc[NR][kCols];
  for (int r = 0; r < NR; ++r)
    for (int c = 0; c < kCols; ++c) acc[r][c] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + S::kStep <= K; k += S::kStep) {
    typename S::V wv[kCols];
    for (int c = 0; c < kCols; ++c) wv[c] = S::load(ws[c] + k);
    for (int r = 0; r < NR; ++r) {
      const typename S::V xv = S::load(xs[r] + k);
      for (int c = 0; c < kCols; ++c) acc[r][c] = S::add_products(acc[r][c], xv, wv[c]);
    }
  }
  if (k < K) {
    typename S::V wv[kCols];
    for (int c = 0; c < kCols; ++c) wv[c] = S::load_first(ws[c] + k, K - k);
    for (int r = 0; r < NR; ++r) {
      const typename S::V xv = S::load_first(xs[r] + k, K - k);
      for (int c = 0; c < kCols; ++c) acc[r][c] = S::add_products(acc[r][c], xv, wv[c]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int c = 0; c < kCols; ++c) out[r][c] = _mm512_reduce_add_ps(acc[r][c]);
}
#endif

// out[r][c] = dot(xs[r], ws[c]) over K, for NR rows and kCols weight rows (a block with fewer
// columns repeats its last one; the caller ignores those results): on the vector code of this
// build for T, else in plain C++.
template <typename T, int NR>
inline void block_dot(const T* const* xs, const T* const* ws, int64_t K, float out[kRows][kCols]) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) {
    block_dot_vector<F32Steps, NR>(xs, ws, K, out);
  } else
#endif
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
  if constexpr (std::is_same_v<T, bf16>) {
    block_dot_vector<Bf16Steps, NR>(xs, ws, K, out);
  } else
#endif
  {
    float acc[NR][kCols] = {};
    for (int64_t k = 0; k < K; ++k) {
      float wv[kCols];
      for (int c = 0; c < kCols; ++c) wv[c] = static_cast<float>(ws[c][k]);
      for (int r = 0; r < NR; ++r) {
        const float xv = static_cast<float>(xs[r][k]);
        for (int c = 0; c < kCols; ++c) acc[r][c] += xv * wv[c];
      }
    }
    for (int r = 0; r < NR; ++r)
      for (int c = 0; c < kCols; ++c) out[r][c] = acc[r][c];
  }
}

template <typename T>
inline void dot_rows(const T* const* xs, int nr, const T* const* ws, int64_t K, float out[kRows][kCols]) {
  switch (nr) {
    case 1: block_dot<T, 1>(xs, ws, K, out); break;
    case 2: block_dot<T, 2>(xs, ws, K, out); break;
    case 3: block_dot<T, 3>(xs, ws, K, out); break;
    default: block_dot<T, 4>(xs, ws, K, out); break;
  }
}

template <typename T>
inline float rounded(float v) {
  return static_cast<float>(static_cast<T>(v));
}

template <typename T>
void fused_moe_impl(const T* x, const float* weights, const int32_t* ids, const T* w13, const T* w2, T* y,
                    int64_t tokens, int64_t k, int64_t hidden, int64_t inter, int64_t experts) {
  const int64_t pairs = tokens * k;
  // (token, choice) pairs sorted by expert, in token order within an expert
  std::vector<int64_t> start(experts + 1, 0);
  for (int64_t p = 0; p < pairs; ++p) ++start[ids[p] + 1];
  for (int64_t e = 0; e < experts; ++e) start[e + 1] += start[e];
  std::vector<int64_t> order(pairs), where(pairs);
  {
    std::vector<int64_t> next(start.begin(), start.end() - 1);
    for (int64_t p = 0; p < pairs; ++p) {
      const int64_t pos = next[ids[p]]++;
      order[pos] = p;
      where[p] = pos;
    }
  }
  std::vector<T> act(pairs * inter);
  std::vector<float> down(pairs * hidden);

  auto tasks_for = [&](int64_t cols) {
    std::vector<std::pair<int64_t, int64_t>> tasks;
    for (int64_t e = 0; e < experts; ++e)
      if (start[e + 1] > start[e])
        for (int64_t c = 0; c < cols; c += kTile) tasks.emplace_back(e, c);
    return tasks;
  };

  // gate and up, then the SwiGLU, into act (rows in sorted order)
  const auto up_tasks = tasks_for(inter);
  at::parallel_for(0, static_cast<int64_t>(up_tasks.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const auto [e, c0] = up_tasks[t];
      const T* we = w13 + e * 2 * inter * hidden;
      const int64_t c1 = std::min(c0 + kTile, inter);
      for (int64_t c = c0; c < c1; c += kCols) {
        const int nc = static_cast<int>(std::min<int64_t>(kCols, c1 - c));
        const T* gate_w[kCols];
        const T* up_w[kCols];
        for (int i = 0; i < kCols; ++i) {
          const int64_t col = c + std::min(i, nc - 1);
          gate_w[i] = we + col * hidden;
          up_w[i] = we + (inter + col) * hidden;
        }
        for (int64_t r0 = start[e]; r0 < start[e + 1]; r0 += kRows) {
          const int nr = static_cast<int>(std::min<int64_t>(kRows, start[e + 1] - r0));
          const T* xs[kRows];
          for (int r = 0; r < kRows; ++r) xs[r] = x + (order[r0 + std::min(r, nr - 1)] / k) * hidden;
          float g[kRows][kCols], u[kRows][kCols];
          dot_rows<T>(xs, nr, gate_w, hidden, g);
          dot_rows<T>(xs, nr, up_w, hidden, u);
          for (int r = 0; r < nr; ++r) {
            T* a = act.data() + (r0 + r) * inter + c;
            for (int i = 0; i < nc; ++i) {
              const float gv = rounded<T>(g[r][i]);
              const float silu = rounded<T>(gv / (1.f + std::exp(-gv)));
              a[i] = static_cast<T>(silu * rounded<T>(u[r][i]));
            }
          }
        }
      }
    }
  });

  // down, rounded to the model's dtype
  const auto down_tasks = tasks_for(hidden);
  at::parallel_for(0, static_cast<int64_t>(down_tasks.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const auto [e, c0] = down_tasks[t];
      const T* we = w2 + e * hidden * inter;
      const int64_t c1 = std::min(c0 + kTile, hidden);
      for (int64_t c = c0; c < c1; c += kCols) {
        const int nc = static_cast<int>(std::min<int64_t>(kCols, c1 - c));
        const T* ws[kCols];
        for (int i = 0; i < kCols; ++i) ws[i] = we + (c + std::min(i, nc - 1)) * inter;
        for (int64_t r0 = start[e]; r0 < start[e + 1]; r0 += kRows) {
          const int nr = static_cast<int>(std::min<int64_t>(kRows, start[e + 1] - r0));
          const T* xs[kRows];
          for (int r = 0; r < kRows; ++r) xs[r] = act.data() + (r0 + std::min(r, nr - 1)) * inter;
          float d[kRows][kCols];
          dot_rows<T>(xs, nr, ws, inter, d);
          for (int r = 0; r < nr; ++r)
            for (int i = 0; i < nc; ++i) down[(r0 + r) * hidden + c + i] = rounded<T>(d[r][i]);
        }
      }
    }
  });

  // each token's experts, weighted, summed in the order of its choices
  at::parallel_for(0, tokens, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> sum(hidden);
    for (int64_t t = begin; t < end; ++t) {
      std::fill(sum.begin(), sum.end(), 0.f);
      for (int64_t j = 0; j < k; ++j) {
        const float w = weights[t * k + j];
        const float* d = down.data() + where[t * k + j] * hidden;
#pragma omp simd
        for (int64_t h = 0; h < hidden; ++h) sum[h] += w * d[h];
      }
      T* out = y + t * hidden;
      for (int64_t h = 0; h < hidden; ++h) out[h] = static_cast<T>(sum[h]);
    }
  });
}

at::Tensor fused_moe(const at::Tensor& x, const at::Tensor& topk_weights, const at::Tensor& topk_ids,
                        const at::Tensor& w13, const at::Tensor& w2) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "fused_moe: x must be a contiguous (T, H) tensor");
  TORCH_CHECK(topk_weights.scalar_type() == at::kFloat && topk_weights.is_contiguous(),
              "fused_moe: topk_weights must be contiguous fp32");
  TORCH_CHECK(topk_ids.scalar_type() == at::kInt && topk_ids.is_contiguous(),
              "fused_moe: topk_ids must be contiguous int32");
  TORCH_CHECK(w13.dim() == 3 && w2.dim() == 3 && w13.is_contiguous() && w2.is_contiguous(),
              "fused_moe: w13 and w2 must be contiguous 3-D tensors");
  TORCH_CHECK(w13.scalar_type() == x.scalar_type() && w2.scalar_type() == x.scalar_type(),
              "fused_moe: weights and x must have one dtype");
  const int64_t tokens = x.size(0), hidden = x.size(1), k = topk_ids.size(1);
  const int64_t experts = w13.size(0), inter = w13.size(1) / 2;
  TORCH_CHECK(w13.size(2) == hidden && w2.size(0) == experts && w2.size(1) == hidden && w2.size(2) == inter,
              "fused_moe: expert shapes do not match");
  TORCH_CHECK(topk_ids.size(0) == tokens && topk_weights.sizes() == topk_ids.sizes(),
              "fused_moe: routing shapes do not match");
  const int32_t* ids = topk_ids.data_ptr<int32_t>();
  for (int64_t p = 0; p < tokens * k; ++p)
    TORCH_CHECK(ids[p] >= 0 && ids[p] < experts, "fused_moe: expert id out of range");
  auto y = at::empty_like(x);
  if (tokens == 0) return y;
  if (x.scalar_type() == at::kFloat) {
    fused_moe_impl<float>(x.data_ptr<float>(), topk_weights.data_ptr<float>(), ids, w13.data_ptr<float>(),
                          w2.data_ptr<float>(), y.data_ptr<float>(), tokens, k, hidden, inter, experts);
  } else if (x.scalar_type() == at::kBFloat16) {
    fused_moe_impl<bf16>(x.data_ptr<bf16>(), topk_weights.data_ptr<float>(), ids, w13.data_ptr<bf16>(),
                         w2.data_ptr<bf16>(), y.data_ptr<bf16>(), tokens, k, hidden, inter, experts);
  } else {
    TORCH_CHECK(false, "fused_moe: fp32 or bf16 only");
  }
  return y;
}
LMISERVE_OP(fused_moe, "(Tensor x, Tensor topk_weights, Tensor topk_ids, Tensor w13, Tensor w2) -> Tensor");

}  // namespace
