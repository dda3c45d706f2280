// Per-row argmax and log-sum-exp of fp32 logits in one pass (what greedy decoding and the
// chosen token's log-probability need), instead of several full passes over (rows, vocab).
//
// With AVX-512 or AVX2 the row is read 16 (8) lanes at a time: its maximum, then the first
// lane that holds it, then the sum of e^(x - max) by the vector exponential of bf16_vec.h. A
// row that holds a NaN or +inf gets a NaN log-sum-exp, which the sampler reads as "not finite"
// (the kernel is built with -ffast-math, so that is found from the bits, not by comparisons).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>

#include "bf16_vec.h"

#ifndef LMISERVE_OPS_NS
#define LMISERVE_OPS_NS lmiserve_cpu
#endif
#define LMISERVE_FRAGMENT(ns, m) TORCH_LIBRARY_FRAGMENT(ns, m)

namespace {

constexpr uint32_t kAbs = 0x7fffffffu, kInf = 0x7f800000u;

// Whether x is a NaN or +inf, from its bits.
inline bool not_finite_above(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return (bits & kAbs) > kInf || bits == kInf;
}

struct RowResult {
  int64_t arg;
  float lse;
};

RowResult portable_row(const float* row, int64_t vocab) {
  float max_value = row[0];
  bool bad = false;
  for (int64_t i = 0; i < vocab; ++i) {
    max_value = std::max(max_value, row[i]);
    bad |= not_finite_above(row[i]);
  }
  int64_t arg = 0;
  while (arg < vocab - 1 && row[arg] != max_value) ++arg;  // the first maximum, as torch.argmax
  float sum = 0.f;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(row[i] - max_value);
  return {arg, bad ? std::numeric_limits<float>::quiet_NaN() : max_value + std::log(sum)};
}

#if defined(__AVX512F__)
RowResult vector_row(const float* row, int64_t vocab) {
  const int64_t whole = vocab / 16 * 16;
  __m512 vmax = _mm512_set1_ps(row[0]);
  __mmask16 bad = 0;
  const __m512i abs_mask = _mm512_set1_epi32(static_cast<int>(kAbs)), inf = _mm512_set1_epi32(static_cast<int>(kInf));
  for (int64_t i = 0; i < whole; i += 16) {
    const __m512 x = _mm512_loadu_ps(row + i);
    vmax = _mm512_max_ps(vmax, x);
    const __m512i bits = _mm512_castps_si512(x);
    bad |= _mm512_cmpgt_epi32_mask(_mm512_and_si512(bits, abs_mask), inf) | _mm512_cmpeq_epi32_mask(bits, inf);
  }
  float max_value = _mm512_reduce_max_ps(vmax);
  bool tail_bad = false;
  for (int64_t i = whole; i < vocab; ++i) {
    max_value = std::max(max_value, row[i]);
    tail_bad |= not_finite_above(row[i]);
  }
  if (bad || tail_bad) return {0, std::numeric_limits<float>::quiet_NaN()};
  int64_t arg = -1;
  const __m512 top = _mm512_set1_ps(max_value);
  for (int64_t i = 0; i < whole && arg < 0; i += 16) {
    const __mmask16 hit = _mm512_cmp_ps_mask(_mm512_loadu_ps(row + i), top, _CMP_EQ_OQ);
    if (hit) arg = i + __builtin_ctz(hit);
  }
  for (int64_t i = whole; i < vocab && arg < 0; ++i)
    if (row[i] == max_value) arg = i;
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < whole; i += 16) acc = _mm512_add_ps(acc, lmiserve::exp16(_mm512_sub_ps(_mm512_loadu_ps(row + i), top)));
  float sum = _mm512_reduce_add_ps(acc);
  for (int64_t i = whole; i < vocab; ++i) sum += std::exp(row[i] - max_value);
  return {std::max<int64_t>(arg, 0), max_value + std::log(sum)};
}
#elif defined(__AVX2__) && defined(__FMA__)
inline float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

RowResult vector_row(const float* row, int64_t vocab) {
  const int64_t whole = vocab / 8 * 8;
  __m256 vmax = _mm256_set1_ps(row[0]);
  __m256i bad = _mm256_setzero_si256();
  const __m256i abs_mask = _mm256_set1_epi32(static_cast<int>(kAbs)), inf = _mm256_set1_epi32(static_cast<int>(kInf));
  for (int64_t i = 0; i < whole; i += 8) {
    const __m256 x = _mm256_loadu_ps(row + i);
    vmax = _mm256_max_ps(vmax, x);
    const __m256i bits = _mm256_castps_si256(x);
    bad = _mm256_or_si256(bad, _mm256_cmpgt_epi32(_mm256_and_si256(bits, abs_mask), inf));
    bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(bits, inf));
  }
  float max_value = hmax8(vmax);
  bool any_bad = !_mm256_testz_si256(bad, bad);
  for (int64_t i = whole; i < vocab; ++i) {
    max_value = std::max(max_value, row[i]);
    any_bad |= not_finite_above(row[i]);
  }
  if (any_bad) return {0, std::numeric_limits<float>::quiet_NaN()};
  int64_t arg = -1;
  const __m256 top = _mm256_set1_ps(max_value);
  for (int64_t i = 0; i < whole && arg < 0; i += 8) {
    const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(row + i), top, _CMP_EQ_OQ));
    if (hit) arg = i + __builtin_ctz(hit);
  }
  for (int64_t i = whole; i < vocab && arg < 0; ++i)
    if (row[i] == max_value) arg = i;
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < whole; i += 8) acc = _mm256_add_ps(acc, lmiserve::exp8(_mm256_sub_ps(_mm256_loadu_ps(row + i), top)));
  float sum = hsum8(acc);
  for (int64_t i = whole; i < vocab; ++i) sum += std::exp(row[i] - max_value);
  return {std::max<int64_t>(arg, 0), max_value + std::log(sum)};
}
#else
RowResult vector_row(const float* row, int64_t vocab) { return portable_row(row, vocab); }
#endif

std::tuple<at::Tensor, at::Tensor> argmax_logsumexp(const at::Tensor& logits) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat, "logits must be (rows, vocab) float32");
  const auto x = logits.contiguous();
  const int64_t rows = x.size(0), vocab = x.size(1);
  auto best = at::empty({rows}, x.options().dtype(at::kLong));
  auto lse = at::empty({rows}, x.options());
  const float* data = x.data_ptr<float>();
  int64_t* best_ptr = best.data_ptr<int64_t>();
  float* lse_ptr = lse.data_ptr<float>();
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const RowResult result = vocab > 0 ? vector_row(data + r * vocab, vocab) : RowResult{0, 0.f};
      best_ptr[r] = result.arg;
      lse_ptr[r] = result.lse;
    }
  });
  return {best, lse};
}

}  // namespace

LMISERVE_FRAGMENT(LMISERVE_OPS_NS, m) {
  m.def("argmax_logsumexp(Tensor logits) -> (Tensor, Tensor)");
  m.impl("argmax_logsumexp", c10::DispatchKey::CPU, &argmax_logsumexp);
}
