// Linear layers whose weight is in GGUF blocks (Q4_0, Q4_1, Q8_0), read as the file stores them:
// y = x W^T (+ bias) with W (N, K) as N rows of K / 32 blocks, each an fp16 scale d (Q4_1: and an
// fp16 minimum m) then its 32 quants. A quant becomes its weight exactly as the fp32 dequantization
// does (d * q + m, d * (q - 8), d * q: one rounding, which a fused multiply-add gives too).
//
// Each output row's blocks are dequantized in registers as they stream in, and used against every
// row of x before the next block: the weight is read from memory once a call, at 4.5 to 8.5 bits a
// weight. Threads split the output rows. Four weight rows at a time, against up to four x rows.
//
// - bf16 x (CPUs with AVX512_BF16): a block's 32 weights are rounded to bf16 (as the model's bf16
//   weights would be) and multiplied with vdpbf16ps, 32 products an instruction.
// - fp32 x: fp32 weights and fused multiply-adds, on AVX-512 or AVX2 (16 or 8 lanes), else plain C++.
// The sums of a row are formed in the same order whatever the number of rows: a row's result does
// not depend on the rest of the batch.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#ifndef LMISERVE_OPS_NS
#define LMISERVE_OPS_NS lmiserve_cpu
#endif
#define LMISERVE_FRAGMENT(ns, m) TORCH_LIBRARY_FRAGMENT(ns, m)

namespace {

enum Kind : int64_t { kQ4_0 = 0, kQ4_1 = 1, kQ8_0 = 2 };
constexpr int64_t kBlock = 32;
constexpr int64_t kR = 4;  // weight rows at a time
constexpr int64_t kM = 4;  // x rows at a time

constexpr int64_t block_bytes(int64_t kind) { return kind == kQ4_0 ? 18 : kind == kQ4_1 ? 20 : 34; }

inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return static_cast<float>(c10::Half(h, c10::Half::from_bits()));
}

// One block's 32 weights in fp32 (the portable path, and the definition the vector code follows).
template <int64_t KIND>
inline void dequant_scalar(const uint8_t* b, float* w) {
  const float d = half_at(b);
  if constexpr (KIND == kQ8_0) {
    for (int i = 0; i < 32; ++i) w[i] = d * static_cast<float>(static_cast<int8_t>(b[2 + i]));
  } else {
    const float m = KIND == kQ4_1 ? half_at(b + 2) : -8.f * d;
    const uint8_t* qs = b + (KIND == kQ4_1 ? 4 : 2);
    for (int i = 0; i < 16; ++i) {
      w[i] = std::fma(static_cast<float>(qs[i] & 0xF), d, m);
      w[i + 16] = std::fma(static_cast<float>(qs[i] >> 4), d, m);
    }
  }
}

#if defined(__AVX512F__)
// A block's weights 0-15 (lo) and 16-31 (hi) in fp32.
template <int64_t KIND>
inline void dequant16x2(const uint8_t* b, __m512& lo, __m512& hi) {
  const __m512 d = _mm512_set1_ps(_cvtsh_ss(*reinterpret_cast<const uint16_t*>(b)));
  if constexpr (KIND == kQ8_0) {
    lo = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2)))));
    hi = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 18)))));
  } else {
    const __m512 m = KIND == kQ4_1 ? _mm512_set1_ps(_cvtsh_ss(*reinterpret_cast<const uint16_t*>(b + 2)))
                                   : _mm512_mul_ps(d, _mm512_set1_ps(-8.f));
    const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + (KIND == kQ4_1 ? 4 : 2))));
    lo = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(q, _mm512_set1_epi32(0xF))), d, m);
    hi = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(q, 4)), d, m);
  }
}
#elif defined(__AVX2__)
// A block's weights in four vectors of 8: 0-7, 8-15, 16-23, 24-31.
template <int64_t KIND>
inline void dequant8x4(const uint8_t* b, __m256* w) {
  const __m256 d = _mm256_set1_ps(_cvtsh_ss(*reinterpret_cast<const uint16_t*>(b)));
  if constexpr (KIND == kQ8_0) {
    for (int i = 0; i < 4; ++i)
      w[i] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 2 + 8 * i)))));
  } else {
    const __m256 m = KIND == kQ4_1 ? _mm256_set1_ps(_cvtsh_ss(*reinterpret_cast<const uint16_t*>(b + 2)))
                                   : _mm256_mul_ps(d, _mm256_set1_ps(-8.f));
    const uint8_t* qs = b + (KIND == kQ4_1 ? 4 : 2);
    for (int h = 0; h < 2; ++h) {
      const __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + 8 * h)));
      w[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(q, _mm256_set1_epi32(0xF))), d, m);
      w[h + 2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(q, 4)), d, m);
    }
  }
}

inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif

// fp32 x: R weight rows (n0 ..) against MR rows of x (ldx apart), sums into out[r * MR + m].
template <int64_t KIND, int R, int MR>
void rows_f32(const uint8_t* w, int64_t ldw, const float* x, int64_t ldx, int64_t blocks, float* out) {
#if defined(__AVX512F__)
  __m512 acc[R][MR];
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MR; ++m) acc[r][m] = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    for (int r = 0; r < R; ++r) {
      __m512 lo, hi;
      dequant16x2<KIND>(w + r * ldw + b * block_bytes(KIND), lo, hi);
      for (int m = 0; m < MR; ++m) {
        const float* xb = x + m * ldx + b * kBlock;
        acc[r][m] = _mm512_fmadd_ps(lo, _mm512_loadu_ps(xb), acc[r][m]);
        acc[r][m] = _mm512_fmadd_ps(hi, _mm512_loadu_ps(xb + 16), acc[r][m]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MR; ++m) out[r * MR + m] = _mm512_reduce_add_ps(acc[r][m]);
#elif defined(__AVX2__)
  __m256 acc[R][MR];
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MR; ++m) acc[r][m] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    for (int r = 0; r < R; ++r) {
      __m256 v[4];
      dequant8x4<KIND>(w + r * ldw + b * block_bytes(KIND), v);
      for (int m = 0; m < MR; ++m) {
        const float* xb = x + m * ldx + b * kBlock;
        for (int i = 0; i < 4; ++i) acc[r][m] = _mm256_fmadd_ps(v[i], _mm256_loadu_ps(xb + 8 * i), acc[r][m]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MR; ++m) out[r * MR + m] = hsum8(acc[r][m]);
#else
  float acc[R][MR][kBlock] = {};
  float v[kBlock];
  for (int64_t b = 0; b < blocks; ++b)
    for (int r = 0; r < R; ++r) {
      dequant_scalar<KIND>(w + r * ldw + b * block_bytes(KIND), v);
      for (int m = 0; m < MR; ++m)
        for (int i = 0; i < kBlock; ++i) acc[r][m][i] = std::fma(v[i], x[m * ldx + b * kBlock + i], acc[r][m][i]);
    }
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MR; ++m) {
      float s = 0.f;
      for (int i = 0; i < kBlock; ++i) s += acc[r][m][i];
      out[r * MR + m] = s;
    }
#endif
}

#if defined(__AVX512BF16__)
// bf16 x: a block's 32 weights rounded to bf16, in x's order (0-15 then 16-31).
template <int64_t KIND>
inline __m512bh dequant_bf16(const uint8_t* b) {
  __m512 lo, hi;
  dequant16x2<KIND>(b, lo, hi);
  return _mm512_cvtne2ps_pbh(hi, lo);
}

template <int64_t KIND, int R, int MR>
void rows_bf16(const uint8_t* w, int64_t ldw, const uint16_t* x, int64_t ldx, int64_t blocks, float* out) {
  __m512 acc[R][MR];
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MR; ++m) acc[r][m] = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    __m512bh xv[MR];
    for (int m = 0; m < MR; ++m) xv[m] = (__m512bh)_mm512_loadu_si512(x + m * ldx + b * kBlock);
    for (int r = 0; r < R; ++r) {
      const __m512bh wv = dequant_bf16<KIND>(w + r * ldw + b * block_bytes(KIND));
      for (int m = 0; m < MR; ++m) acc[r][m] = _mm512_dpbf16_ps(acc[r][m], wv, xv[m]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MR; ++m) out[r * MR + m] = _mm512_reduce_add_ps(acc[r][m]);
}
#endif

template <typename T>
inline void put(T* y, float v) {
  if constexpr (std::is_same_v<T, float>) {
    *y = v;
  } else {
    *y = static_cast<T>(v);  // c10::BFloat16 rounds to nearest even
  }
}

template <int64_t KIND, typename X>
void multiply(const X* x, const uint8_t* w, const float* bias, X* y, int64_t m, int64_t n, int64_t k) {
  const int64_t blocks = k / kBlock, ldw = blocks * block_bytes(KIND);
  const int64_t groups = (n + kR - 1) / kR;
  at::parallel_for(0, groups, 1, [&](int64_t g0, int64_t g1) {
    float sums[kR * kM];
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t n0 = g * kR, rows = std::min(kR, n - n0);
      for (int64_t m0 = 0; m0 < m; m0 += kM) {
        const int64_t mr = std::min(kM, m - m0);
        const uint8_t* wg = w + n0 * ldw;
        // full groups of weight rows take the 4-row kernels; the last partial one, row by row
        for (int64_t r0 = 0; r0 < rows; r0 += (rows == kR ? kR : 1)) {
          const int64_t rr = rows == kR ? kR : 1;
          float* s = sums;
#if defined(__AVX512BF16__)
          if constexpr (std::is_same_v<X, c10::BFloat16>) {
            const auto* xb = reinterpret_cast<const uint16_t*>(x + m0 * k);
            const uint8_t* wr = wg + r0 * ldw;
            if (rr == kR) {
              switch (mr) {
                case 1: rows_bf16<KIND, kR, 1>(wr, ldw, xb, k, blocks, s); break;
                case 2: rows_bf16<KIND, kR, 2>(wr, ldw, xb, k, blocks, s); break;
                case 3: rows_bf16<KIND, kR, 3>(wr, ldw, xb, k, blocks, s); break;
                default: rows_bf16<KIND, kR, 4>(wr, ldw, xb, k, blocks, s); break;
              }
            } else {
              switch (mr) {
                case 1: rows_bf16<KIND, 1, 1>(wr, ldw, xb, k, blocks, s); break;
                case 2: rows_bf16<KIND, 1, 2>(wr, ldw, xb, k, blocks, s); break;
                case 3: rows_bf16<KIND, 1, 3>(wr, ldw, xb, k, blocks, s); break;
                default: rows_bf16<KIND, 1, 4>(wr, ldw, xb, k, blocks, s); break;
              }
            }
          } else
#endif
          {
            static_assert(std::is_same_v<X, float> || std::is_same_v<X, c10::BFloat16>);
            if constexpr (std::is_same_v<X, float>) {
              const float* xf = x + m0 * k;
              const uint8_t* wr = wg + r0 * ldw;
              if (rr == kR) {
                switch (mr) {
                  case 1: rows_f32<KIND, kR, 1>(wr, ldw, xf, k, blocks, s); break;
                  case 2: rows_f32<KIND, kR, 2>(wr, ldw, xf, k, blocks, s); break;
                  case 3: rows_f32<KIND, kR, 3>(wr, ldw, xf, k, blocks, s); break;
                  default: rows_f32<KIND, kR, 4>(wr, ldw, xf, k, blocks, s); break;
                }
              } else {
                switch (mr) {
                  case 1: rows_f32<KIND, 1, 1>(wr, ldw, xf, k, blocks, s); break;
                  case 2: rows_f32<KIND, 1, 2>(wr, ldw, xf, k, blocks, s); break;
                  case 3: rows_f32<KIND, 1, 3>(wr, ldw, xf, k, blocks, s); break;
                  default: rows_f32<KIND, 1, 4>(wr, ldw, xf, k, blocks, s); break;
                }
              }
            }
          }
          for (int64_t r = 0; r < rr; ++r)
            for (int64_t i = 0; i < mr; ++i) {
              const int64_t col = n0 + r0 + r;
              float v = s[r * mr + i];
              if (bias) v += bias[col];
              put(y + (m0 + i) * n + col, v);
            }
        }
      }
    }
  });
}

std::string quant_linear_isa() {
#if defined(__AVX512BF16__)
  return "avx512_bf16";
#elif defined(__AVX512F__)
  return "avx512";
#elif defined(__AVX2__)
  return "avx2";
#else
  return "portable";
#endif
}

// y = x W^T (+ bias): x (..., K) fp32 or bf16, blocks (N, K / 32 * bytes) uint8, kind 0 (Q4_0),
// 1 (Q4_1) or 2 (Q8_0). bf16 x without AVX512_BF16 is widened to fp32 first.
at::Tensor linear_gguf(const at::Tensor& x, const at::Tensor& blocks, int64_t kind, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(kind >= kQ4_0 && kind <= kQ8_0, "kind is 0 (Q4_0), 1 (Q4_1) or 2 (Q8_0)");
  TORCH_CHECK(blocks.dim() == 2 && blocks.scalar_type() == at::kByte && blocks.is_contiguous(), "blocks: contiguous uint8 (N, bytes)");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "linear_gguf takes fp32 or bf16 x");
  const int64_t k = x.size(-1), n = blocks.size(0);
  TORCH_CHECK(k % kBlock == 0 && blocks.size(1) == k / kBlock * block_bytes(kind), "x has ", k,
              " features; the blocks hold ", blocks.size(1), " bytes a row");
  auto x2 = x.reshape({-1, k}).contiguous();
  const auto out_dtype = x.scalar_type();
#if !defined(__AVX512BF16__)
  if (x2.scalar_type() == at::kBFloat16) x2 = x2.to(at::kFloat);
#endif
  const int64_t m = x2.size(0);
  auto shape = x.sizes().vec();
  shape.back() = n;
  auto y = at::empty({m, n}, x2.options());
  at::Tensor bias_f32;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->numel() == n, "bias must have N values");
    bias_f32 = bias->to(at::kFloat).contiguous();
  }
  const float* bs = bias_f32.defined() ? bias_f32.data_ptr<float>() : nullptr;
  const uint8_t* w = blocks.data_ptr<uint8_t>();
  if (m > 0) {
    auto run = [&](auto tag) {
      using X = decltype(tag);
      const X* xs = x2.data_ptr<X>();
      X* ys = y.data_ptr<X>();
      switch (kind) {
        case kQ4_0: multiply<kQ4_0, X>(xs, w, bs, ys, m, n, k); break;
        case kQ4_1: multiply<kQ4_1, X>(xs, w, bs, ys, m, n, k); break;
        default: multiply<kQ8_0, X>(xs, w, bs, ys, m, n, k); break;
      }
    };
    if (x2.scalar_type() == at::kFloat) run(float{});
    else run(c10::BFloat16{});
  }
  return y.to(out_dtype).view(shape);
}

}  // namespace

LMISERVE_FRAGMENT(LMISERVE_OPS_NS, m) {
  m.def("linear_gguf(Tensor x, Tensor blocks, int kind, Tensor? bias=None) -> Tensor");
  m.impl("linear_gguf", c10::DispatchKey::CPU, &linear_gguf);
  m.def("quant_linear_isa() -> str");
  m.impl("quant_linear_isa", c10::DispatchKey::CatchAll, &quant_linear_isa);
}
