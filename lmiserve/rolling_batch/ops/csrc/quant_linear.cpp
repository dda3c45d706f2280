// Linear layers whose weight is in GGUF blocks (Q4_0, Q4_1, Q8_0): y = x W^T (+ bias), the
// weight repacked once (csrc/gguf_pack.cpp, csrc/gguf_layout.h) and read from memory once a call, at 4.5 to 8.5 bits
// a weight. Threads split the output rows; four weight rows at a time against up to four x rows.
//
// - bf16 x (CPUs with AVX512_BF16): Q4 weights d q + m rounded to bf16 (as the model's bf16 weights
//   would be), looked up by their nibbles in a table of the 32 values a pair of blocks can take;
//   Q8_0's d q rounded to bf16 likewise, a block at a time. Sums in fp32, 32 products an
//   instruction. From `tile_rows` rows on, on AMX tiles instead (csrc/quant_linear_amx.cpp).
// - fp32 x: each weight dequantized exactly as the fp32 dequantization does (one rounding of
//   d q + m) and multiplied in fp32, on AVX-512, on AVX2 (csrc/quant_linear_avx2.cpp: each weight
//   row dequantized once a call), else plain C++.
// - bf16 x on the other builds: widened to fp32 and multiplied as fp32 x is, each weight rounded
//   to bf16 after its dequantization (BF16W), so that every build multiplies the weights the
//   model's bf16 tensor holds; Q4 on AVX-512 rounds a table a pair instead (csrc/q4_widened.h).
// A row's sums are formed in the same order whatever the number of rows: a row's result does not
// depend on the rest of the batch (with tiles, as long as every call takes them).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "bf16_vec.h"
#include "build_class.h"
#include "convert.h"
#include "count_dispatch.h"
#include "gguf_layout.h"
#include "op_registration.h"
#include "q4_widened.h"
#include "task_queue.h"

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace lmiserve_gguf {
bool amx_gguf(const uint16_t* x, int64_t m, const uint8_t* w, const Layout& L, int64_t n, const float* bias,
              uint16_t* y);
}

namespace {

using namespace lmiserve_gguf;

inline uint16_t u16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}

#if defined(__AVX512BF16__)
template <int64_t KIND, int R, int MR>
void rows_bf16(const uint8_t* w, int64_t ldw, const Layout& L, const uint16_t* xa, float* out) {
  const int64_t lda = L.arranged();
  __m512 acc[R][MR];
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MR; ++m) acc[r][m] = _mm512_setzero_ps();
  if constexpr (KIND == kQ8_0) {
    for (int64_t b = 0; b < L.blocks; ++b) {
      __m512bh xv[MR];
      for (int m = 0; m < MR; ++m) xv[m] = (__m512bh)_mm512_loadu_si512(xa + m * lda + b * kBlock);
      for (int r = 0; r < R; ++r) {
        const uint8_t* row = w + r * ldw;
        const __m512bh wv = q8_block_bf16(row + b * 32, _cvtsh_ss(u16(row + L.quant_bytes + 2 * b)));
        for (int m = 0; m < MR; ++m) acc[r][m] = _mm512_dpbf16_ps(acc[r][m], wv, xv[m]);
      }
    }
  } else {
    for (int64_t g = 0; 8 * g < L.pairs; ++g) {  // eight pairs at a time: their scales converted once
      const Q4GroupScales<KIND, R> scales(w, ldw, L, g);
      for (int64_t p = 8 * g; p < std::min<int64_t>(L.pairs, 8 * g + 8); ++p) {
        __m512bh xl[MR], xh[MR];
        for (int m = 0; m < MR; ++m) {
          xl[m] = (__m512bh)_mm512_loadu_si512(xa + m * lda + p * 64);
          xh[m] = (__m512bh)_mm512_loadu_si512(xa + m * lda + p * 64 + 32);
        }
        for (int r = 0; r < R; ++r) {  // the next rows' quants asked for as these are used
          _mm_prefetch(reinterpret_cast<const char*>(w + (r + R) * ldw + p * 32), _MM_HINT_T0);
          __m512 dp, mp;
          scales.pair(r, p - 8 * g, dp, mp);
          __m512i lo, hi;
          q4_pair_bf16(w + r * ldw + p * 32, dp, mp, lo, hi);
          for (int m = 0; m < MR; ++m) {
            acc[r][m] = _mm512_dpbf16_ps(acc[r][m], (__m512bh)lo, xl[m]);
            acc[r][m] = _mm512_dpbf16_ps(acc[r][m], (__m512bh)hi, xh[m]);
          }
        }
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MR; ++m) out[r * MR + m] = _mm512_reduce_add_ps(acc[r][m]);
}
#endif
#if !defined(__AVX512F__)
// The plain C++ path's sums, not inlined: every row's come from the same code, whatever number of
// rows its caller was built for (-ffast-math lets an inlined copy reorder them by its context).
[[gnu::noinline]] void accumulate8(const float* w, const float* x, int64_t n, float* acc) {
  for (int64_t i = 0; i < n; ++i) acc[i % 8] = std::fma(w[i], x[i], acc[i % 8]);
}
[[gnu::noinline]] float sum8(const float* acc) {
  float s = 0.f;
  for (int i = 0; i < 8; ++i) s += acc[i];
  return s;
}
#endif

// fp32 x (arranged): each weight d q + m in fp32 (rounded to bf16 where BF16W), then fused
// multiply-adds.
template <int64_t KIND, int R, int MR, bool BF16W>
void rows_f32(const uint8_t* w, int64_t ldw, const Layout& L, const float* xa, float* out) {
  const int64_t lda = L.arranged();
#if defined(LMISERVE_Q4_WIDENED)  // (x deinterleaved: csrc/q4_widened.h)
  if constexpr (BF16W && KIND != kQ8_0) return rows_q4_widened<KIND, R, MR>(w, ldw, L, xa, out);
#endif
#if defined(__AVX512F__)
  const auto weights = [](__m512 v) { return BF16W ? lmiserve::round_bf16(v) : v; };
  __m512 acc[R][MR];
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MR; ++m) acc[r][m] = _mm512_setzero_ps();
  if constexpr (KIND == kQ8_0) {
    for (int64_t b = 0; b < L.blocks; ++b)
      for (int r = 0; r < R; ++r) {
        const uint8_t* row = w + r * ldw;
        const __m512 d = _mm512_set1_ps(_cvtsh_ss(u16(row + L.quant_bytes + 2 * b)));
        for (int h = 0; h < 2; ++h) {
          const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + b * 32 + 16 * h));
          const __m512 wv = weights(_mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q))));
          for (int m = 0; m < MR; ++m)
            acc[r][m] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(xa + m * lda + b * 32 + 16 * h), acc[r][m]);
        }
      }
  } else {
    // dwords from bytes 16 h + i belong to the pair's block (i / 2) % 2: scales d0 d0 d1 d1 ...
    const __m512i twice = _mm512_setr_epi32(0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1);
    for (int64_t p = 0; p < L.pairs; ++p)
      for (int r = 0; r < R; ++r) {
        const uint8_t* row = w + r * ldw;
        uint32_t dd;
        std::memcpy(&dd, row + L.quant_bytes + 4 * p, 4);
        const __m512 d = _mm512_permutexvar_ps(twice, _mm512_cvtph_ps(_mm256_set1_epi32(static_cast<int>(dd))));
        __m512 mv;
        if constexpr (KIND == kQ4_1) {
          uint32_t mm;
          std::memcpy(&mm, row + L.quant_bytes + 2 * L.scales + 4 * p, 4);
          mv = _mm512_permutexvar_ps(twice, _mm512_cvtph_ps(_mm256_set1_epi32(static_cast<int>(mm))));
        } else {
          mv = _mm512_mul_ps(d, _mm512_set1_ps(-8.f));
        }
        for (int h = 0; h < 2; ++h) {
          const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + p * 32 + 16 * h)));
          const __m512 lo = weights(_mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(q, _mm512_set1_epi32(0xF))), d, mv));
          const __m512 hi = weights(_mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(q, 4)), d, mv));
          for (int m = 0; m < MR; ++m) {
            const float* xb = xa + m * lda + p * 64 + 16 * h;
            acc[r][m] = _mm512_fmadd_ps(lo, _mm512_loadu_ps(xb), acc[r][m]);
            acc[r][m] = _mm512_fmadd_ps(hi, _mm512_loadu_ps(xb + 32), acc[r][m]);
          }
        }
      }
  }
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MR; ++m) out[r * MR + m] = _mm512_reduce_add_ps(acc[r][m]);
#else
  // plain C++ (AVX2: csrc/quant_linear_avx2.cpp): a block (Q8) or a pair (Q4) dequantized into
  // fp32, then multiplied
  const auto weight = [](float v) { return BF16W ? lmiserve::round_to<c10::BFloat16>(v) : v; };
  float acc[R][MR][8] = {};
  alignas(32) float wv[64];
  const int64_t units = KIND == kQ8_0 ? L.blocks : L.pairs, width = KIND == kQ8_0 ? 32 : 64;
  for (int64_t u = 0; u < units; ++u) {
    for (int r = 0; r < R; ++r) {
      const uint8_t* row = w + r * ldw;
      const uint8_t* scales = row + L.quant_bytes;
      if constexpr (KIND == kQ8_0) {
        const float d = half_bits(u16(scales + 2 * u));
        for (int i = 0; i < 32; ++i) wv[i] = weight(d * static_cast<float>(static_cast<int8_t>(row[u * 32 + i])));
      } else {
        for (int j = 0; j < 32; ++j) {
          const int64_t b = 2 * u + (j / 2) % 2;
          const float d = half_bits(u16(scales + 2 * b));
          const float mn = KIND == kQ4_1 ? half_bits(u16(scales + 2 * L.scales + 2 * b)) : -8.f * d;
          const uint8_t byte = row[u * 32 + j];
          wv[j] = weight(std::fma(static_cast<float>(byte & 0xF), d, mn));
          wv[32 + j] = weight(std::fma(static_cast<float>(byte >> 4), d, mn));
        }
      }
      for (int m = 0; m < MR; ++m) accumulate8(wv, xa + m * lda + u * width, width, acc[r][m]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MR; ++m) out[r * MR + m] = sum8(acc[r][m]);
#endif
}

#if defined(__AVX512F__)
constexpr int kR = 4, kM = 4;
#else
constexpr int kR = 2, kM = 2;
#endif

constexpr int64_t kAheadGroups = 4;  // how far ahead a thread requests its groups' weight rows
constexpr int64_t kUnitGroups = 8;   // groups a thread takes at a time (csrc/task_queue.h)

// R weight rows against mr (<= kM) arranged x rows: their sums into s[r * mr + m].
template <int64_t KIND, int R, bool BF16W, typename A>
void some_rows(const uint8_t* w, int64_t ldw, const Layout& L, const A* xa, int64_t mr, float* s) {
  auto call = [&](auto tag) {
    constexpr int MR = decltype(tag)::value;
    if constexpr (std::is_same_v<A, float>) {
      rows_f32<KIND, R, MR, BF16W>(w, ldw, L, xa, s);
    } else {
#if defined(__AVX512BF16__)
      rows_bf16<KIND, R, MR>(w, ldw, L, xa, s);
#endif
    }
  };
  lmiserve::for_count<kM>(mr, call);
}

// y (m, n) = x W^T from arranged x (A: float, or bf16 bits).
template <int64_t KIND, bool BF16W, typename A, typename Y>
void multiply(const A* xa, int64_t m, const uint8_t* w, const Layout& L, int64_t n,
              const float* bias, Y* y) {
  const int64_t groups = (n + kR - 1) / kR, lda = L.arranged();
  lmiserve::for_each_unit((groups + kUnitGroups - 1) / kUnitGroups, [&](auto take) {
    float s[kR * kM];
    for (lmiserve::Taken u = take(); u.unit >= 0; u = take()) {
      // this unit's groups; the weight rows kAheadGroups groups on are requested while these are
      // used, up to the end of the run of units that is likely this thread's
      const int64_t g1 = std::min(groups, (u.unit + 1) * kUnitGroups);
      const int64_t ahead_end = std::min(groups, u.end * kUnitGroups);
      for (int64_t g = u.unit * kUnitGroups; g < g1; ++g) {
        const int64_t n0 = g * kR, rows = std::min<int64_t>(kR, n - n0);
        if (g + kAheadGroups < ahead_end)
          prefetch_bytes(w + (n0 + kAheadGroups * kR) * L.row_bytes, kR * L.row_bytes);
        for (int64_t m0 = 0; m0 < m; m0 += kM) {
          const int64_t mr = std::min<int64_t>(kM, m - m0);
          const A* xm = xa + m0 * lda;
          for (int64_t r0 = 0; r0 < rows; r0 += (rows == kR ? kR : 1)) {
            const int64_t rr = rows == kR ? kR : 1;
            const uint8_t* wr = w + (n0 + r0) * L.row_bytes;
            if (rr == kR) some_rows<KIND, kR, BF16W>(wr, L.row_bytes, L, xm, mr, s);
            else some_rows<KIND, 1, BF16W>(wr, L.row_bytes, L, xm, mr, s);
            for (int64_t r = 0; r < rr; ++r)
              for (int64_t i = 0; i < mr; ++i) {
                const int64_t col = n0 + r0 + r;
                const float v = s[r * mr + i] + (bias ? bias[col] : 0.f);
                y[(m0 + i) * n + col] = static_cast<Y>(v);
              }
          }
        }
      }
    }
  });
}

std::string quant_linear_isa() { return lmiserve::build_class(); }
LMISERVE_ANY_OP(quant_linear_isa, "() -> str");

template <bool BF16W, typename A, typename Y>
void dispatch(const A* xa, int64_t m, const uint8_t* w, const Layout& L, int64_t n, const float* bias, Y* y) {
  with_kind(L.kind, [&](auto kind) { multiply<decltype(kind)::value, BF16W>(xa, m, w, L, n, bias, y); });
}

// y = x W^T (+ bias) for a weight from pack_gguf: x (..., K) fp32, bf16 or fp16 (fp16 through
// fp32). bf16 rows take the tiles from `tile_rows` rows on (0: never) where AMX runs here.
at::Tensor linear_gguf(const at::Tensor& x, const at::Tensor& packed, int64_t kind, const c10::optional<at::Tensor>& bias,
                       int64_t tile_rows) {
  TORCH_CHECK(kind >= kQ4_0 && kind <= kQ8_0, "kind is 0 (Q4_0), 1 (Q4_1) or 2 (Q8_0)");
  const int64_t k = x.size(-1), n = packed.size(0);
  TORCH_CHECK(k % kBlock == 0, "x has ", k, " features, not whole blocks of 32");
  const Layout L(kind, k);
  TORCH_CHECK(packed.dim() == 2 && packed.scalar_type() == at::kByte && packed.is_contiguous() &&
                  packed.size(1) == L.row_bytes,
              "x has ", k, " features; the packed weight does not take them");
  const auto out_dtype = x.scalar_type();
  TORCH_CHECK(out_dtype == at::kFloat || out_dtype == at::kBFloat16 || out_dtype == at::kHalf,
              "linear_gguf takes fp32, bf16 or fp16 x");
  auto x2 = x.reshape({-1, k}).contiguous();
  bool bf16 = out_dtype == at::kBFloat16;
#if !defined(__AVX512BF16__)
  bf16 = false;
#endif
  const int64_t m = x2.size(0);
  auto shape = x.sizes().vec();
  shape.back() = n;
  auto y = at::empty({m, n}, x2.options().dtype(bf16 ? at::kBFloat16 : at::kFloat));
  at::Tensor bias_f32;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->numel() == n, "bias must have N values");
    bias_f32 = bias->to(at::kFloat).contiguous();
  }
  const float* bs = bias_f32.defined() ? bias_f32.data_ptr<float>() : nullptr;
  const uint8_t* w = packed.data_ptr<uint8_t>();
  if (m > 0 && bf16) {
    const auto* xs = reinterpret_cast<const uint16_t*>(x2.data_ptr());
    auto* ys = reinterpret_cast<uint16_t*>(y.data_ptr());
    if (!(tile_rows > 0 && m >= tile_rows && amx_gguf(xs, m, w, L, n, bs, ys))) {
      std::vector<uint16_t> xa(m * L.arranged());
      arrange_x(reinterpret_cast<const c10::BFloat16*>(xs), m, L, reinterpret_cast<c10::BFloat16*>(xa.data()));
      dispatch<false>(xa.data(), m, w, L, n, bs, reinterpret_cast<c10::BFloat16*>(ys));
    }
  } else if (m > 0) {
    std::vector<float> xa(m * L.arranged());
    const bool bf16_weights = out_dtype == at::kBFloat16;  // bf16 x: widened as arranged
    if (bf16_weights) arrange_x(x2.data_ptr<c10::BFloat16>(), m, L, xa.data());
    else if (out_dtype == at::kHalf) arrange_x(x2.data_ptr<c10::Half>(), m, L, xa.data());
    else arrange_x(x2.data_ptr<float>(), m, L, xa.data());
#if defined(LMISERVE_Q4_WIDENED)
    if (bf16_weights && kind != kQ8_0) widened_x(xa.data(), m, L.arranged());
#endif
    float* yf = y.data_ptr<float>();
    if (!avx2_gguf(xa.data(), m, w, L, n, bs, bf16_weights, yf)) {
#if !defined(__AVX512BF16__)  // (with it, bf16 x never comes here)
      if (bf16_weights) dispatch<true>(xa.data(), m, w, L, n, bs, yf);
      else
#endif
        dispatch<false>(xa.data(), m, w, L, n, bs, yf);
    }
  }
  return y.to(out_dtype).view(shape);
}
LMISERVE_OP(linear_gguf, "(Tensor x, Tensor packed, int kind, Tensor? bias=None, int tile_rows=0) -> Tensor");

}  // namespace
