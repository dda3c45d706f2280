// Per-row argmax and log-sum-exp of fp32 logits in one pass (what greedy decoding and the
// chosen token's log-probability need), instead of several full passes over (rows, vocab).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <tuple>

namespace {

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
      const float* row = data + r * vocab;
      float max_value = row[0];
#pragma omp simd reduction(max : max_value)
      for (int64_t i = 0; i < vocab; ++i) max_value = std::max(max_value, row[i]);
      int64_t arg = 0;
      while (arg < vocab - 1 && row[arg] != max_value) ++arg;  // the first maximum, as torch.argmax
      float sum = 0.f;
#pragma omp simd reduction(+ : sum)
      for (int64_t i = 0; i < vocab; ++i) sum += std::exp(row[i] - max_value);
      best_ptr[r] = arg;
      lse_ptr[r] = max_value + std::log(sum);
    }
  });
  return {best, lse};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(lmiserve_cpu, m) {
  m.def("argmax_logsumexp(Tensor logits) -> (Tensor, Tensor)");
  m.impl("argmax_logsumexp", c10::DispatchKey::CPU, &argmax_logsumexp);
}
