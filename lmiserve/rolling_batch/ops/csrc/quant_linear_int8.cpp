// GGUF-block linear layers (Q4_0, Q4_1, Q8_0) against activations quantized to int8
// (option.quantize_activations=int8): y = x W^T (+ bias) with each x row quantized per block of
// 32 inputs, as llama.cpp quantizes its activations to Q8 blocks:
//   d = max |x| * (1/127) in fp32, q = round(x * (1/d)) to nearest even (q = 0 where d = 0).
// A block's product is then exact in integers: Q8_0 d_w d_x sum(q_w q_x), Q4_0 (w = d_w (q_w - 8))
// d_w d_x (sum(q_w q_x) - 8 sum(q_x)), Q4_1 (w = d_w q_w + m_w) d_w d_x sum(q_w q_x) + m_w s_x with
// s_x = d_x sum(q_x). Only the fp32 sums of the blocks' products round.
// The weights (csrc/gguf_lanes.h, from pack_gguf_int8) are never turned into floats: 8 rows at a
// time, one (row, block) a 32-bit lane, multiplied four bytes a lane (vpdpbusd with AVX512_VNNI,
// else pmaddubsw and pmaddwd: AVX-512 and AVX2), each lane summing one block's integers, then
// scaled once a group of lanes; the 8 rows' outputs come out of one vector. Plain C++ elsewhere.
// A row's result does not depend on the batch.
// This changes results against the dequantized model: it is opt-in.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "count_dispatch.h"
#include "gguf_lanes.h"
#include "gguf_layout.h"
#include "task_queue.h"
#include "op_registration.h"

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

using namespace lmiserve_gguf;

constexpr float kInv127 = 1.0 / 127.0;

// x rows quantized and arranged as the lanes take them (csrc/gguf_lanes.h): q (int8, x_row() a
// row), and per block (x_scales() a row, zeros past the last) d, the sum of its quants, and
// s = d sum(q).
struct QuantizedRows {
  std::vector<int8_t> q;
  std::vector<float> d, s;
  std::vector<int32_t> sum;
  int64_t ldq, ld;

  template <typename X>
  QuantizedRows(const X* x, int64_t m, const LanesLayout& L) : ldq(L.x_row()), ld(L.x_scales()) {
    q.assign(m * ldq, 0);
    d.assign(m * ld, 0.f);
    s.assign(m * ld, 0.f);
    sum.assign(m * ld, 0);
    at::parallel_for(0, m, 8, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) quantize_row(x + r * L.k, L, r);
    });
  }

  template <typename X>
  void quantize_row(const X* row, const LanesLayout& L, int64_t r) {
    for (int64_t b = 0; b < L.blocks; ++b) {
      float v[kBlock], amax = 0.f;
      for (int i = 0; i < kBlock; ++i) {
        v[i] = static_cast<float>(row[b * kBlock + i]);
        amax = std::max(amax, std::fabs(v[i]));
      }
      // each through memory, so that -ffast-math cannot rewrite x * (1 / (amax * (1/127))) into
      // another expression that rounds differently from the definition's three fp32 roundings
      const volatile float scaled = amax * kInv127;
      const float scale = scaled;
      const volatile float reciprocal = scale > 0.f ? 1.f / scale : 0.f;
      const float inverse = reciprocal;
      int8_t qb[kBlock];
      int total = 0;
      for (int i = 0; i < kBlock; ++i) {
        qb[i] = static_cast<int8_t>(std::clamp(std::nearbyint(v[i] * inverse), -127.f, 127.f));
        total += qb[i];
      }
      // inputs i..i+3 go to run i / 4 (Q8_0), or 2 (i % 16 / 4) + i / 16 (Q4), of the block's group
      int8_t* group = q.data() + r * ldq + (b / kGroup) * 8 * kGroup * 4 + (b % kGroup) * 4;
      for (int i = 0; i < kBlock; i += 4) {
        const int run = L.kind == kQ8_0 ? i / 4 : 2 * (i % 16 / 4) + i / 16;
        std::memcpy(group + run * kGroup * 4, qb + i, 4);
      }
      d[r * ld + b] = scale;
      sum[r * ld + b] = total;
      s[r * ld + b] = scale * static_cast<float>(total);
    }
  }
};

inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return half_bits(h);
}

#if defined(__AVX512F__)
constexpr int kM = 8;

// Four products a lane added to acc: unsigned bytes u (at most 15, or any with VNNI) by signed s.
inline __m512i dot4(__m512i acc, __m512i u, __m512i s) {
#if defined(__AVX512VNNI__)
  return _mm512_dpbusd_epi32(acc, u, s);
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)));
#endif
}

// 8 bytes (or floats: two) at p, in every 64-bit lane: a group's two blocks' values for 8 rows.
inline __m512i pairs_of(const void* p) {
  int64_t v;
  std::memcpy(&v, p, 8);
  return _mm512_set1_epi64(v);
}

// A set's 8 rows against MR x rows: out[m * 8 + r].
template <int64_t KIND, int MR>
void set_rows(const uint8_t* w, const LanesLayout& L, const QuantizedRows& x, int64_t m0, float* out) {
  __m512 acc[MR];
  for (int m = 0; m < MR; ++m) acc[m] = _mm512_setzero_ps();
  const uint8_t* scales = w + L.quant_bytes;
  for (int64_t j = 0; j < L.groups; ++j) {
    const int8_t* xg = x.q.data() + m0 * x.ldq + j * 64;
    __m512i sums[MR];
    for (int m = 0; m < MR; ++m) sums[m] = _mm512_setzero_si512();
    for (int64_t t = 0; t < L.runs; ++t) {
      const __m512i wv = _mm512_loadu_si512(w + (j * L.runs + t) * 64);
      if constexpr (KIND == kQ8_0) {
#if defined(__AVX512VNNI__)  // w + 128, unsigned: 128 sum(q_x) taken off below
        const __m512i u = _mm512_xor_si512(wv, _mm512_set1_epi8(static_cast<char>(0x80)));
        for (int m = 0; m < MR; ++m) sums[m] = _mm512_dpbusd_epi32(sums[m], u, pairs_of(xg + m * x.ldq + t * 8));
#else  // |w| by x with w's sign
        const __m512i u = _mm512_abs_epi8(wv);
        const __mmask64 negative = _mm512_movepi8_mask(wv);
        for (int m = 0; m < MR; ++m) {
          const __m512i xv = pairs_of(xg + m * x.ldq + t * 8);
          sums[m] = dot4(sums[m], u, _mm512_mask_sub_epi8(xv, negative, _mm512_setzero_si512(), xv));
        }
#endif
      } else {
        const __m512i nibble = _mm512_set1_epi8(0xF);
        const __m512i lo = _mm512_and_si512(wv, nibble), hi = _mm512_and_si512(_mm512_srli_epi16(wv, 4), nibble);
        for (int m = 0; m < MR; ++m) {
          const int8_t* xr = xg + m * x.ldq + 2 * t * 8;
          sums[m] = dot4(dot4(sums[m], lo, pairs_of(xr)), hi, pairs_of(xr + 8));
        }
      }
    }
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales + 2 * j * kLanes)));
    for (int m = 0; m < MR; ++m) {
      const int64_t at = (m0 + m) * x.ld + j * kGroup;
      __m512i sv = sums[m];
      if constexpr (KIND == kQ4_0) sv = _mm512_sub_epi32(sv, _mm512_slli_epi32(pairs_of(x.sum.data() + at), 3));
#if defined(__AVX512VNNI__)
      if constexpr (KIND == kQ8_0) sv = _mm512_sub_epi32(sv, _mm512_slli_epi32(pairs_of(x.sum.data() + at), 7));
#endif
      const __m512 dx = _mm512_castsi512_ps(pairs_of(x.d.data() + at));
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sv), _mm512_mul_ps(dw, dx), acc[m]);
      if constexpr (KIND == kQ4_1) {
        const __m256i mins = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales + 2 * (L.groups + j) * kLanes));
        acc[m] = _mm512_fmadd_ps(_mm512_cvtph_ps(mins), _mm512_castsi512_ps(pairs_of(x.s.data() + at)), acc[m]);
      }
    }
  }
  alignas(64) float lanes[kLanes];
  for (int m = 0; m < MR; ++m) {  // lanes 2r and 2r + 1: row r's two blocks of each group
    _mm512_store_ps(lanes, _mm512_add_ps(acc[m], _mm512_permute_ps(acc[m], 0xB1)));
    for (int r = 0; r < 8; ++r) out[m * 8 + r] = lanes[2 * r];
  }
}
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
constexpr int kM = 4;

inline __m256i spread(const int8_t* p) {  // 4 bytes in every 32-bit lane: one block's, 8 rows
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

template <int64_t KIND, int MR>
void set_rows(const uint8_t* w, const LanesLayout& L, const QuantizedRows& x, int64_t m0, float* out) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[MR];
  for (int m = 0; m < MR; ++m) acc[m] = _mm256_setzero_ps();
  const uint8_t* scales = w + L.quant_bytes;
  for (int64_t j = 0; j < L.groups; ++j) {
    const int8_t* xg = x.q.data() + m0 * x.ldq + j * 32;
    __m256i sums[MR];
    for (int m = 0; m < MR; ++m) sums[m] = _mm256_setzero_si256();
    for (int64_t t = 0; t < L.runs; ++t) {
      const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + (j * L.runs + t) * 32));
      if constexpr (KIND == kQ8_0) {  // |w| by x with w's sign: pairs of products at most 2 128 127
        const __m256i u = _mm256_abs_epi8(wv);
        for (int m = 0; m < MR; ++m) {
          const __m256i xv = spread(xg + m * x.ldq + t * 4);
          sums[m] = _mm256_add_epi32(sums[m], _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_sign_epi8(xv, wv)), ones));
        }
      } else {
        const __m256i nibble = _mm256_set1_epi8(0xF);
        const __m256i lo = _mm256_and_si256(wv, nibble), hi = _mm256_and_si256(_mm256_srli_epi16(wv, 4), nibble);
        for (int m = 0; m < MR; ++m) {
          const int8_t* xr = xg + m * x.ldq + 2 * t * 4;
          const __m256i pairs =  // at most 4 15 127 a 16-bit lane
              _mm256_add_epi16(_mm256_maddubs_epi16(lo, spread(xr)), _mm256_maddubs_epi16(hi, spread(xr + 4)));
          sums[m] = _mm256_add_epi32(sums[m], _mm256_madd_epi16(pairs, ones));
        }
      }
    }
    const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + 2 * j * kLanes)));
    for (int m = 0; m < MR; ++m) {
      const int64_t at = (m0 + m) * x.ld + j;
      __m256i sv = sums[m];
      if constexpr (KIND == kQ4_0) sv = _mm256_sub_epi32(sv, _mm256_set1_epi32(8 * x.sum[at]));
      acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sv), _mm256_mul_ps(dw, _mm256_set1_ps(x.d[at])), acc[m]);
      if constexpr (KIND == kQ4_1) {
        const __m128i mins = _mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + 2 * (L.groups + j) * kLanes));
        acc[m] = _mm256_fmadd_ps(_mm256_cvtph_ps(mins), _mm256_set1_ps(x.s[at]), acc[m]);
      }
    }
  }
  for (int m = 0; m < MR; ++m) _mm256_storeu_ps(out + m * 8, acc[m]);
}
#else
constexpr int kM = 1;

// A set's 8 rows against one x row, not inlined: every row's sums come from this code.
template <int64_t KIND>
[[gnu::noinline]] void set_row(const uint8_t* w, const LanesLayout& L, const QuantizedRows& x, int64_t m0, float* out) {
  float acc[kLanes] = {};
  const uint8_t* scales = w + L.quant_bytes;
  for (int64_t j = 0; j < L.groups; ++j) {
    const int8_t* xg = x.q.data() + m0 * x.ldq + j * 8 * kGroup * 4;
    for (int64_t l = 0; l < kLanes; ++l) {
      const int64_t g = l % kGroup;  // the lane's block in the group
      int32_t total = 0;
      for (int64_t t = 0; t < L.runs; ++t)
        for (int i = 0; i < 4; ++i) {
          const uint8_t byte = w[((j * L.runs + t) * kLanes + l) * 4 + i];
          if constexpr (KIND == kQ8_0) total += static_cast<int8_t>(byte) * xg[(t * kGroup + g) * 4 + i];
          else
            total += (byte & 0xF) * xg[(2 * t * kGroup + g) * 4 + i] + (byte >> 4) * xg[((2 * t + 1) * kGroup + g) * 4 + i];
        }
      const int64_t at = m0 * x.ld + j * kGroup + g;
      if constexpr (KIND == kQ4_0) total -= 8 * x.sum[at];
      acc[l] += static_cast<float>(total) * (half_at(scales + 2 * (j * kLanes + l)) * x.d[at]);
      if constexpr (KIND == kQ4_1) acc[l] += half_at(scales + 2 * ((L.groups + j) * kLanes + l)) * x.s[at];
    }
  }
  for (int64_t r = 0; r < kSetRows; ++r) {
    float v = 0.f;
    for (int64_t l = r * kGroup; l < (r + 1) * kGroup; ++l) v += acc[l];
    out[r] = v;
  }
}

template <int64_t KIND, int MR>
void set_rows(const uint8_t* w, const LanesLayout& L, const QuantizedRows& x, int64_t m0, float* out) {
  set_row<KIND>(w, L, x, m0, out);
}
#endif

constexpr int64_t kUnitSets = 4;  // sets a thread takes at a time (csrc/task_queue.h)

template <int64_t KIND>
void multiply(const QuantizedRows& x, int64_t m, const uint8_t* w, const LanesLayout& L, int64_t n, const float* bias,
              float* y) {
  const int64_t sets = LanesLayout::sets(n);
  lmiserve::for_each_unit((sets + kUnitSets - 1) / kUnitSets, [&](auto take) {
    float s[kM * kSetRows];
    for (lmiserve::Taken u = take(); u.unit >= 0; u = take())
      for (int64_t set = u.unit * kUnitSets; set < std::min(sets, (u.unit + 1) * kUnitSets); ++set) {
        const uint8_t* ws = w + set * L.set_bytes;
        if (set + 2 < sets) prefetch_bytes(ws + 2 * L.set_bytes, L.set_bytes);
        const int64_t n0 = set * kSetRows, rows = std::min(kSetRows, n - n0);
        for (int64_t m0 = 0; m0 < m; m0 += kM) {
          const int64_t mr = std::min<int64_t>(kM, m - m0);
          lmiserve::for_count<kM>(mr, [&](auto tag) { set_rows<KIND, decltype(tag)::value>(ws, L, x, m0, s); });
          for (int64_t i = 0; i < mr; ++i)
            for (int64_t r = 0; r < rows; ++r) y[(m0 + i) * n + n0 + r] = s[i * kSetRows + r] + (bias ? bias[n0 + r] : 0.f);
        }
      }
  });
}

// y = x W^T (+ bias) for a weight of n rows from pack_gguf_int8, x (..., K) fp32, bf16 or fp16 quantized per
// row and block to int8; y in x's dtype.
at::Tensor linear_gguf_int8(const at::Tensor& x, const at::Tensor& packed, int64_t kind, int64_t n,
                            const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(kind >= kQ4_0 && kind <= kQ8_0, "kind is 0 (Q4_0), 1 (Q4_1) or 2 (Q8_0)");
  const int64_t k = x.size(-1);
  TORCH_CHECK(k % kBlock == 0, "x has ", k, " features, not whole blocks of 32");
  const LanesLayout L(kind, k);
  TORCH_CHECK(packed.dim() == 2 && packed.scalar_type() == at::kByte && packed.is_contiguous() &&
                  packed.size(0) == LanesLayout::sets(n) && packed.size(1) == L.set_bytes,
              "x has ", k, " features; the packed weight does not take them");
  const auto dtype = x.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf,
              "linear_gguf_int8 takes fp32, bf16 or fp16 x");
  const auto x2 = x.reshape({-1, k}).contiguous();
  const int64_t m = x2.size(0);
  auto shape = x.sizes().vec();
  shape.back() = n;
  auto y = at::empty({m, n}, x2.options().dtype(at::kFloat));
  at::Tensor bias_f32;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->numel() == n, "bias must have N values");
    bias_f32 = bias->to(at::kFloat).contiguous();
  }
  if (m > 0) {
    const QuantizedRows xq = dtype == at::kFloat      ? QuantizedRows(x2.data_ptr<float>(), m, L)
                             : dtype == at::kBFloat16 ? QuantizedRows(x2.data_ptr<c10::BFloat16>(), m, L)
                                                      : QuantizedRows(x2.data_ptr<c10::Half>(), m, L);
    const float* bs = bias_f32.defined() ? bias_f32.data_ptr<float>() : nullptr;
    with_kind(kind, [&](auto kd) {
      multiply<decltype(kd)::value>(xq, m, packed.data_ptr<uint8_t>(), L, n, bs, y.data_ptr<float>());
    });
  }
  return y.to(dtype).view(shape);
}
LMISERVE_OP(linear_gguf_int8, "(Tensor x, Tensor packed, int kind, int n, Tensor? bias=None) -> Tensor");

}  // namespace
