// LoRA for a whole step on the CPU, in one call per projection.
//
// The step's rows come in runs (slot, first, end), each run's request using the adapter in one
// slot of the pool: A is (slots, parts * rank, in), B is (slots, parts * rank, out). Part p of a
// fused projection (q, k, v; gate, up) owns B's rows p * rank .. (p + 1) * rank and its columns
// part_cols[p] .. part_cols[p + 1]; the rest of B is zeros, which are skipped here. Each row's
// u = A[slot] x is computed in fp32 and rounded to the activations' type (as a product in that
// type would be), then u B[slot] is added to y in fp32 (one multiply-add of a B row over the
// outputs at a time) and rounded once. With AVX-512 the bf16 rows run on explicit vector code
// (AVX512_BF16's bf16 dot products where the CPU has them). Rows are shared out between threads;
// a row's result does not depend on the others.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <type_traits>
#include <vector>

#include "bf16_vec.h"
#include "convert.h"
#include "op_registration.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

#if defined(__AVX512F__)
// dot(a, x) over n bf16 values, in fp32 (bf16 pairs multiplied directly with AVX512_BF16)
inline float dot_bf16(const c10::BFloat16* a, const c10::BFloat16* x, int64_t n) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t k = 0;
#if defined(__AVX512BF16__)
  for (; k + 32 <= n; k += 32) {
    const __m512i av = _mm512_loadu_si512(a + k), xv = _mm512_loadu_si512(x + k);
    acc0 = _mm512_dpbf16_ps(acc0, (__m512bh)av, (__m512bh)xv);
  }
#endif
  for (; k + 32 <= n; k += 32) {
    acc0 = _mm512_fmadd_ps(lmiserve::bf16x16(a + k), lmiserve::bf16x16(x + k), acc0);
    acc1 = _mm512_fmadd_ps(lmiserve::bf16x16(a + k + 16), lmiserve::bf16x16(x + k + 16), acc1);
  }
  float sum = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
  for (; k < n; ++k) sum += lmiserve::to_f32(a[k]) * lmiserve::to_f32(x[k]);
  return sum;
}

// y[c0:c1] += u[r] * B[r][c0:c1] for two ranks at a time
inline void axpy2_bf16(float* y, const c10::BFloat16* b0, const c10::BFloat16* b1, float u0, float u1, int64_t c0,
                       int64_t c1) {
  const __m512 v0 = _mm512_set1_ps(u0), v1 = _mm512_set1_ps(u1);
  int64_t o = c0;
  for (; o + 16 <= c1; o += 16) {
    __m512 acc = _mm512_loadu_ps(y + o);
    acc = _mm512_fmadd_ps(v0, lmiserve::bf16x16(b0 + o), acc);
    acc = _mm512_fmadd_ps(v1, lmiserve::bf16x16(b1 + o), acc);
    _mm512_storeu_ps(y + o, acc);
  }
  for (; o < c1; ++o) y[o] += u0 * lmiserve::to_f32(b0[o]) + u1 * lmiserve::to_f32(b1[o]);
}

// one row of a bf16 step: the same arithmetic as lora_rows, vectorized by hand
void lora_row_bf16(c10::BFloat16* yr, const c10::BFloat16* xr, const c10::BFloat16* as, const c10::BFloat16* bs,
                   const std::vector<int64_t>& part_cols, int64_t in, int64_t out, int64_t width, int64_t rank,
                   float* u, float* yf) {
  for (int64_t w = 0; w < width; ++w) {
    u[w] = lmiserve::to_f32(lmiserve::from_f32<c10::BFloat16>(dot_bf16(as + w * in, xr, in)));
  }
  for (int64_t o = 0; o < out; ++o) yf[o] = lmiserve::to_f32(yr[o]);
  const int64_t parts = static_cast<int64_t>(part_cols.size()) - 1;
  for (int64_t p = 0; p < parts; ++p) {
    for (int64_t r = p * rank; r + 1 < (p + 1) * rank; r += 2) {
      if (u[r] == 0.f && u[r + 1] == 0.f) continue;  // ranks the adapter does not use
      axpy2_bf16(yf, bs + r * out, bs + (r + 1) * out, u[r], u[r + 1], part_cols[p], part_cols[p + 1]);
    }
    if (rank % 2) {
      const int64_t r = (p + 1) * rank - 1;
      axpy2_bf16(yf, bs + r * out, bs + r * out, u[r], 0.f, part_cols[p], part_cols[p + 1]);
    }
  }
  for (int64_t o = 0; o < out; ++o) yr[o] = lmiserve::from_f32<c10::BFloat16>(yf[o]);
}
#endif

template <typename scalar_t>
void lora_rows(scalar_t* y, const scalar_t* x, const scalar_t* a, const scalar_t* b, const std::vector<int64_t>& rows,
               const std::vector<int64_t>& slots, const std::vector<int64_t>& part_cols, int64_t in, int64_t out,
               int64_t width, int64_t rank) {
  const int64_t parts = static_cast<int64_t>(part_cols.size()) - 1;
  const int64_t count = static_cast<int64_t>(rows.size());
  at::parallel_for(0, count, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> xf(in), u(width), yf(out);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t t = rows[i];
      const int64_t slot = slots[i];
#if defined(__AVX512F__)
      if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
        lora_row_bf16(y + t * out, x + t * in, a + slot * width * in, b + slot * width * out, part_cols, in, out, width,
                      rank, u.data(), yf.data());
        continue;
      }
#endif
      const scalar_t* xr = x + t * in;
      for (int64_t k = 0; k < in; ++k) xf[k] = lmiserve::to_f32(xr[k]);
      // u = A[slot] x, rounded to the activations' type
      const scalar_t* as = a + slot * width * in;
      for (int64_t w = 0; w < width; ++w) {
        const scalar_t* ar = as + w * in;
        float acc = 0.f;
        for (int64_t k = 0; k < in; ++k) acc += lmiserve::to_f32(ar[k]) * xf[k];
        u[w] = lmiserve::to_f32(lmiserve::from_f32<scalar_t>(acc));
      }
      // y += u B[slot], each part over its own columns
      const scalar_t* bs = b + slot * width * out;
      scalar_t* yr = y + t * out;
      for (int64_t o = 0; o < out; ++o) yf[o] = lmiserve::to_f32(yr[o]);
      for (int64_t p = 0; p < parts; ++p) {
        const int64_t c0 = part_cols[p], c1 = part_cols[p + 1];
        for (int64_t r = p * rank; r < (p + 1) * rank; ++r) {
          const float coef = u[r];
          if (coef == 0.f) continue;  // a rank the adapter does not use
          const scalar_t* br = bs + r * out;
          for (int64_t o = c0; o < c1; ++o) yf[o] += coef * lmiserve::to_f32(br[o]);
        }
      }
      for (int64_t o = 0; o < out; ++o) yr[o] = lmiserve::from_f32<scalar_t>(yf[o]);
    }
  });
}

void lora_add_(at::Tensor y, const at::Tensor& x, const at::Tensor& a, const at::Tensor& b, const at::Tensor& runs,
               const at::Tensor& part_cols) {
  TORCH_CHECK(y.is_contiguous() && x.is_contiguous() && a.is_contiguous() && b.is_contiguous(),
              "lora_add_: contiguous inputs only");
  TORCH_CHECK(x.scalar_type() == y.scalar_type() && a.scalar_type() == y.scalar_type() &&
                  b.scalar_type() == y.scalar_type(),
              "lora_add_: one dtype for y, x, A and B");
  const int64_t in = x.size(1), out = y.size(1), width = a.size(1);
  const int64_t parts = part_cols.size(0) - 1;
  TORCH_CHECK(parts >= 1 && width % parts == 0, "lora_add_: A's rows must split evenly into the parts");
  TORCH_CHECK(b.size(1) == width && b.size(2) == out, "lora_add_: B must be (slots, A's rows, out)");
  auto r = runs.contiguous().to(at::kLong);
  auto pr = part_cols.contiguous().to(at::kLong);
  std::vector<int64_t> rows, slots, bounds(pr.data_ptr<int64_t>(), pr.data_ptr<int64_t>() + parts + 1);
  const int64_t* rp = r.data_ptr<int64_t>();
  for (int64_t g = 0; g < r.size(0); ++g) {
    for (int64_t t = rp[3 * g + 1]; t < rp[3 * g + 2]; ++t) {
      rows.push_back(t);
      slots.push_back(rp[3 * g]);
    }
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, y.scalar_type(), "lora_add_", [&] {
    lora_rows<scalar_t>(y.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(), a.data_ptr<scalar_t>(), b.data_ptr<scalar_t>(),
                        rows, slots, bounds, in, out, width, width / parts);
  });
}
LMISERVE_OP(lora_add_, "(Tensor(a!) y, Tensor x, Tensor a, Tensor b, Tensor runs, Tensor part_cols) -> ()");

}  // namespace
