// Storing a step's keys and values into the paged cache on the CPU: one call for both caches,
// rows copied whole, slot -1 skipped (what the reference op does with a mask and two
// index_copy_ calls per layer).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstring>

namespace {

void write_kv_(const at::Tensor& k, const at::Tensor& v, at::Tensor& k_cache, at::Tensor& v_cache,
               const at::Tensor& slot_mapping) {
  TORCH_CHECK(k.is_contiguous() && v.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous(),
              "write_kv_ needs contiguous keys, values and caches");
  TORCH_CHECK(k.scalar_type() == k_cache.scalar_type() && v.scalar_type() == v_cache.scalar_type(),
              "keys and values must have the cache's dtype");
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.dim() == 1, "slots must be int64 (tokens,)");
  const int64_t tokens = k.size(0);
  const int64_t row = k_cache.numel() / (k_cache.size(0) * k_cache.size(1));  // kv_heads * head_dim
  TORCH_CHECK(k.numel() == tokens * row && v.numel() == tokens * row && slot_mapping.size(0) == tokens,
              "keys, values and slots do not match the cache");
  const int64_t slots = k_cache.size(0) * k_cache.size(1);
  const int64_t bytes = row * static_cast<int64_t>(k.element_size());
  const auto* kp = static_cast<const char*>(k.data_ptr());
  const auto* vp = static_cast<const char*>(v.data_ptr());
  auto* kc = static_cast<char*>(k_cache.data_ptr());
  auto* vc = static_cast<char*>(v_cache.data_ptr());
  const int64_t* sp = slot_mapping.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t) {
    TORCH_CHECK(sp[t] < slots, "slot ", sp[t], " is outside the cache");
  }
  at::parallel_for(0, tokens, 256, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t s = sp[t];
      if (s < 0) continue;
      std::memcpy(kc + s * bytes, kp + t * bytes, bytes);
      std::memcpy(vc + s * bytes, vp + t * bytes, bytes);
    }
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(lmiserve_cpu, m) {
  m.def("write_kv_(Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slot_mapping) -> ()");
  m.impl("write_kv_", c10::DispatchKey::CPU, &write_kv_);
}
