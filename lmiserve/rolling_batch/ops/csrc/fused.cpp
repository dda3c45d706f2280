// Fused element-wise ops for half-precision activations on the CPU: each replaces a chain
// of small torch ops (and their temporaries) with one pass over the data. Arithmetic is
// done in fp32 and rounded to the activation dtype where the reference implementation rounds.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <tuple>
#include <type_traits>

#include "bf16_lanes.h"
#include "bf16_vec.h"
#include "convert.h"
#include "op_registration.h"
#include "rotary.h"

namespace {

using lmiserve::from_f32;
using lmiserve::round_to;

template <typename T>
inline float f32(T v) {
  return lmiserve::to_f32(v);
}

// y = weight * round(x * rstd), rstd = 1 / sqrt(mean(x^2) + eps), per row of `dim` values.
template <typename T>
void rms_rows(const T* x, const T* weight, T* y, float* rstd_out, int64_t rows, int64_t dim, float eps) {
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * dim;
      T* yr = y + r * dim;
      float sq = 0.f;
#pragma omp simd reduction(+ : sq)
      for (int64_t d = 0; d < dim; ++d) sq += f32(xr[d]) * f32(xr[d]);
      const float rstd = 1.f / std::sqrt(sq / static_cast<float>(dim) + eps);
      if (rstd_out) rstd_out[r] = rstd;
#pragma omp simd
      for (int64_t d = 0; d < dim; ++d) yr[d] = from_f32<T>(f32(weight[d]) * round_to<T>(f32(xr[d]) * rstd));
    }
  });
}

#if defined(LMISERVE_BF16_LANES)
// rms_rows for one bf16 row in vectors (the loops above stay scalar for 16-bit types). With
// kAdd, the row normalized is residual <- round(x + residual), written back first; without,
// x itself. Returns rstd.
template <bool kAdd>
float rms_row_bf16(const uint16_t* x, uint16_t* residual, const uint16_t* weight, uint16_t* y, int64_t dim, float eps) {
  using L = lmiserve::Bf16Lanes;
  const uint16_t* h = kAdd ? residual : x;
  L::V sq = L::zero();
  for (int64_t d = 0; d < dim; d += L::kWidth) {
    L::V v = L::load(h + d, dim - d);
    if constexpr (kAdd) {
      v = L::round(L::add(L::load(x + d, dim - d), v));
      L::store(residual + d, v, dim - d);
    }
    sq = L::fmadd(v, v, sq);
  }
  const float rstd = 1.f / std::sqrt(L::sum(sq) / static_cast<float>(dim) + eps);
  const L::V scale = L::set1(rstd);
  for (int64_t d = 0; d < dim; d += L::kWidth) {
    const L::V v = L::round(L::mul(L::load(h + d, dim - d), scale));
    L::store(y + d, L::mul(L::load(weight + d, dim - d), v), dim - d);
  }
  return rstd;
}

#endif

// rms_rows (with kAdd, after residual <- round(x + residual), in the same pass) in vectors for
// bf16; false for another type or where no vector form is built.
template <bool kAdd, typename T>
bool rms_rows_vec(const T* x, T* residual, const T* weight, T* y, float* rstd_out, int64_t rows, int64_t dim,
                  float eps) {
#if defined(LMISERVE_BF16_LANES)
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    const auto* xs = reinterpret_cast<const uint16_t*>(x);
    auto* rs = reinterpret_cast<uint16_t*>(residual);
    const auto* ws = reinterpret_cast<const uint16_t*>(weight);
    auto* ys = reinterpret_cast<uint16_t*>(y);
    at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const float rstd = rms_row_bf16<kAdd>(xs + r * dim, kAdd ? rs + r * dim : nullptr, ws, ys + r * dim, dim, eps);
        if (rstd_out) rstd_out[r] = rstd;
      }
    });
    return true;
  }
#endif
  return false;
}

std::tuple<at::Tensor, at::Tensor> rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.is_contiguous() && weight.is_contiguous(), "rms_norm needs contiguous inputs");
  const int64_t dim = x.size(-1), rows = x.numel() / dim;
  auto y = at::empty_like(x);
  auto rstd_shape = x.sizes().vec();
  rstd_shape.back() = 1;
  auto rstd = at::empty(rstd_shape, x.options().dtype(at::kFloat));
  AT_DISPATCH_REDUCED_FLOATING_TYPES(x.scalar_type(), "rms_norm", [&] {
    if (rms_rows_vec<false, scalar_t>(x.data_ptr<scalar_t>(), nullptr, weight.data_ptr<scalar_t>(),
                                      y.data_ptr<scalar_t>(), rstd.data_ptr<float>(), rows, dim, static_cast<float>(eps)))
      return;
    rms_rows<scalar_t>(x.data_ptr<scalar_t>(), weight.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(),
                       rstd.data_ptr<float>(), rows, dim, static_cast<float>(eps));
  });
  return {y, rstd};
}
LMISERVE_OP(rms_norm, "(Tensor x, Tensor weight, float eps) -> (Tensor, Tensor)");

template <typename T>
void add_in_place(T* res, const T* xs, int64_t n) {
  at::parallel_for(0, n, 1 << 14, [&](int64_t begin, int64_t end) {
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) res[i] = from_f32<T>(f32(xs[i]) + f32(res[i]));
  });
}

// residual <- round(x + residual) in place; returns rms_norm(residual).
at::Tensor add_rms_norm_(const at::Tensor& x, at::Tensor& residual, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.is_contiguous() && residual.is_contiguous() && weight.is_contiguous(), "add_rms_norm needs contiguous inputs");
  TORCH_CHECK(residual.sizes() == x.sizes() && residual.scalar_type() == x.scalar_type() && weight.numel() == x.size(-1),
              "add_rms_norm needs a residual like x and one weight per feature");
  const int64_t dim = x.size(-1), rows = x.numel() / dim;
  auto y = at::empty_like(x);
  AT_DISPATCH_REDUCED_FLOATING_TYPES(x.scalar_type(), "add_rms_norm", [&] {
    if (rms_rows_vec<true, scalar_t>(x.data_ptr<scalar_t>(), residual.data_ptr<scalar_t>(), weight.data_ptr<scalar_t>(),
                                     y.data_ptr<scalar_t>(), nullptr, rows, dim, static_cast<float>(eps)))
      return;
    add_in_place<scalar_t>(residual.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(), rows * dim);
    rms_rows<scalar_t>(residual.data_ptr<scalar_t>(), weight.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), nullptr,
                       rows, dim, static_cast<float>(eps));
  });
  return y;
}
LMISERVE_OP(add_rms_norm_, "(Tensor x, Tensor(a!) residual, Tensor weight, float eps) -> Tensor");

// x (tokens, heads, dim) rotated in place by cos/sin (tokens, dim), half-rotation layout:
// x[i] <- x[i] cos[i] - x[i + dim/2] sin[i];  x[i + dim/2] <- x[i + dim/2] cos[i] + x[i] sin[i].
template <typename T>
void rotate(T* x, const T* cos, const T* sin, int64_t tokens, int64_t heads, int64_t dim, int64_t token_stride,
            int64_t head_stride) {
  const int64_t half = dim / 2;
  at::parallel_for(0, tokens, 8, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const T* c = cos + t * dim;
      const T* s = sin + t * dim;
      for (int64_t h = 0; h < heads; ++h) {
        T* v = x + t * token_stride + h * head_stride;
        lmiserve::rotate_half(v, v, c, s, half);
      }
    }
  });
}

void rotary_(at::Tensor& q, at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && q.stride(2) == 1 && k.stride(2) == 1, "q and k must be (tokens, heads, dim)");
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous(), "cos and sin must be contiguous");
  AT_DISPATCH_REDUCED_FLOATING_TYPES(q.scalar_type(), "rotary", [&] {
    rotate<scalar_t>(q.data_ptr<scalar_t>(), cos.data_ptr<scalar_t>(), sin.data_ptr<scalar_t>(), q.size(0), q.size(1),
                     q.size(2), q.stride(0), q.stride(1));
    rotate<scalar_t>(k.data_ptr<scalar_t>(), cos.data_ptr<scalar_t>(), sin.data_ptr<scalar_t>(), k.size(0), k.size(1),
                     k.size(2), k.stride(0), k.stride(1));
  });
}
LMISERVE_OP(rotary_, "(Tensor(a!) q, Tensor(b!) k, Tensor cos, Tensor sin) -> ()");

#if !defined(__AVX512BF16__) && (defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__)))
#define LMISERVE_SWIGLU_FMA 1
// silu(gate) * up of n bf16 values with the arithmetic of csrc/linear_fma.cpp's fused SwiGLU (the
// same exp and roundings, so a gated product's SwiGLU equals this on its gate_up)
void swiglu_bf16(const uint16_t* g, const uint16_t* u, uint16_t* dst, int64_t n) {
#if defined(__AVX512F__)
  for (int64_t i = 0; i < n; i += 16) {
    const int64_t len = std::min<int64_t>(16, n - i);
    alignas(32) uint16_t gt[16] = {}, ut[16] = {};  // the last partial vector, zero-padded
    const uint16_t* gp = g + i;
    const uint16_t* up = u + i;
    if (len < 16) {
      gp = std::copy(gp, gp + len, gt) - len;
      up = std::copy(up, up + len, ut) - len;
    }
    const __m512 act = lmiserve::swiglu16(lmiserve::widen_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(gp))),
                                          lmiserve::widen_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(up))));
    _mm512_mask_cvtepi32_storeu_epi16(dst + i, static_cast<__mmask16>((1u << len) - 1u), lmiserve::bf16_bits(act));
  }
#else
  for (int64_t i = 0; i < n; i += 8) {
    const int64_t len = std::min<int64_t>(8, n - i);
    lmiserve::store_bf16x8(dst + i, lmiserve::swiglu8(lmiserve::load_bf16x8(g + i, len), lmiserve::load_bf16x8(u + i, len)),
                           len);
  }
#endif
}
#endif

template <typename T>
void swiglu_rows(const T* in, T* out, int64_t rows, int64_t inner) {
  const int64_t width = 2 * inner;
  at::parallel_for(0, rows, 4, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* g = in + r * width;
      const T* u = g + inner;
      T* dst = out + r * inner;
#if defined(__AVX512BF16__)
      if constexpr (std::is_same_v<T, c10::BFloat16>) {  // the arithmetic of linear.cpp's fused SwiGLU
        int64_t i = 0;
        for (; i + 16 <= inner; i += 16) {
          const __m512 act = lmiserve::swiglu16(lmiserve::bf16x16(g + i), lmiserve::bf16x16(u + i));
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), (__m256i)_mm512_cvtneps_pbh(act));
        }
        if (i < inner) {
          const __m512 act = lmiserve::swiglu16(lmiserve::bf16x16(g + i, inner - i), lmiserve::bf16x16(u + i, inner - i));
          _mm256_mask_storeu_epi16(dst + i, static_cast<__mmask16>((1u << (inner - i)) - 1u), (__m256i)_mm512_cvtneps_pbh(act));
        }
        continue;
      }
#elif defined(LMISERVE_SWIGLU_FMA)
      if constexpr (std::is_same_v<T, c10::BFloat16>) {
        swiglu_bf16(reinterpret_cast<const uint16_t*>(g), reinterpret_cast<const uint16_t*>(u),
                    reinterpret_cast<uint16_t*>(dst), inner);
        continue;
      }
#endif
#pragma omp simd
      for (int64_t i = 0; i < inner; ++i) {
        const float gv = f32(g[i]);
        const float silu = round_to<T>(gv / (1.f + std::exp(-gv)));
        dst[i] = from_f32<T>(silu * f32(u[i]));
      }
    }
  });
}

// gate_up (tokens, 2 * inner) -> silu(gate) * up (tokens, inner)
at::Tensor swiglu(const at::Tensor& gate_up) {
  TORCH_CHECK(gate_up.is_contiguous(), "swiglu needs a contiguous input");
  const int64_t width = gate_up.size(-1), inner = width / 2, rows = gate_up.numel() / width;
  auto shape = gate_up.sizes().vec();
  shape.back() = inner;
  auto out = at::empty(shape, gate_up.options());
  AT_DISPATCH_REDUCED_FLOATING_TYPES(gate_up.scalar_type(), "swiglu", [&] {
    swiglu_rows<scalar_t>(gate_up.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), rows, inner);
  });
  return out;
}
LMISERVE_OP(swiglu, "(Tensor gate_up) -> Tensor");

}  // namespace
