// Per-row argmax and log-sum-exp of fp32 logits in one pass (what greedy decoding and the
// chosen token's log-probability need), instead of several full passes over (rows, vocab).
//
// With AVX-512 or AVX2 the row is read 16 (8) lanes at a time: its maximum, then the first
// lane that holds it, then the sum of e^(x - max) by the vector exponential of bf16_vec.h. A
// row that holds a NaN or +inf gets a NaN log-sum-exp, which the sampler reads as "not finite"
// (the kernel is built with -ffast-math, so that is found from the bits, not by comparisons).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>

#include "bf16_lanes.h"
#include "op_registration.h"

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

#if defined(LMISERVE_BF16_LANES)
// The lanes of x that hold a NaN or +inf, a bit a lane.
inline int not_finite_above(__m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i inf = _mm256_set1_epi32(static_cast<int>(kInf));
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(static_cast<int>(kAbs))), inf);
  return _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_or_si256(nan, _mm256_cmpeq_epi32(bits, inf))));
}
#if defined(__AVX512F__)
inline int not_finite_above(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i inf = _mm512_set1_epi32(static_cast<int>(kInf));
  return _mm512_cmpgt_epi32_mask(_mm512_and_si512(bits, _mm512_set1_epi32(static_cast<int>(kAbs))), inf) |
         _mm512_cmpeq_epi32_mask(bits, inf);
}
#endif

RowResult vector_row(const float* row, int64_t vocab) {
  using L = lmiserve::Bf16Lanes;
  const int64_t whole = vocab / L::kWidth * L::kWidth;
  L::V vmax = L::set1(row[0]);
  int bad = 0;
  for (int64_t i = 0; i < whole; i += L::kWidth) {
    const L::V x = L::load_f32(row + i);
    vmax = L::max(vmax, x);
    bad |= not_finite_above(x);
  }
  float max_value = L::reduce_max(vmax);
  for (int64_t i = whole; i < vocab; ++i) {
    max_value = std::max(max_value, row[i]);
    bad |= not_finite_above(row[i]);
  }
  if (bad) return {0, std::numeric_limits<float>::quiet_NaN()};
  int64_t arg = -1;
  const L::V top = L::set1(max_value);
  for (int64_t i = 0; i < whole && arg < 0; i += L::kWidth) {
    const int hit = L::equal_lanes(L::load_f32(row + i), top);
    if (hit) arg = i + __builtin_ctz(hit);
  }
  for (int64_t i = whole; i < vocab && arg < 0; ++i)
    if (row[i] == max_value) arg = i;
  L::V acc = L::zero();
  for (int64_t i = 0; i < whole; i += L::kWidth)
    acc = L::add(acc, lmiserve::exp_lanes<L>(L::sub(L::load_f32(row + i), top)));
  float sum = L::sum(acc);
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
LMISERVE_OP(argmax_logsumexp, "(Tensor logits) -> (Tensor, Tensor)");

}  // namespace
