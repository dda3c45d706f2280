// Storing a step's keys and values into the paged cache on the CPU: one call for both caches,
// rows copied whole, slot -1 skipped (what the reference op does with a mask and two
// index_copy_ calls per layer); and, from the fused q/k/v projection, the rotated queries out,
// the rotated keys and the values straight into their slots, in one pass.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstring>

#include "op_registration.h"
#include "rotary.h"

namespace {

void check_slots(const int64_t* sp, int64_t tokens, int64_t slots) {
  for (int64_t t = 0; t < tokens; ++t) {
    TORCH_CHECK(sp[t] < slots, "slot ", sp[t], " is outside the cache");
  }
}

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
  check_slots(sp, tokens, slots);
  at::parallel_for(0, tokens, 256, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t s = sp[t];
      if (s < 0) continue;
      std::memcpy(kc + s * bytes, kp + t * bytes, bytes);
      std::memcpy(vc + s * bytes, vp + t * bytes, bytes);
    }
  });
}
LMISERVE_OP(write_kv_, "(Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slot_mapping) -> ()");

// qkv (tokens, (heads + 2 kv_heads) dim): q rotated into a new (tokens, heads, dim) tensor, k
// rotated into its slot of k_cache, v copied into its slot of v_cache (slot -1: neither).
at::Tensor rotate_store_(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& k_cache,
                         at::Tensor& v_cache, const at::Tensor& slot_mapping, int64_t heads) {
  TORCH_CHECK(qkv.dim() == 2 && qkv.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous(),
              "rotate_store_ needs a contiguous (tokens, width) qkv and contiguous caches");
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous(), "cos and sin must be contiguous");
  TORCH_CHECK(qkv.scalar_type() == k_cache.scalar_type() && qkv.scalar_type() == v_cache.scalar_type() &&
                  qkv.scalar_type() == cos.scalar_type() && qkv.scalar_type() == sin.scalar_type(),
              "qkv, cos, sin and the caches must share a dtype");
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.dim() == 1, "slots must be int64 (tokens,)");
  const int64_t tokens = qkv.size(0), kv_heads = k_cache.size(2), dim = k_cache.size(3);
  TORCH_CHECK(qkv.size(1) == (heads + 2 * kv_heads) * dim && dim % 2 == 0, "qkv's width is not (heads + 2 kv_heads) dim");
  TORCH_CHECK(cos.size(0) == tokens && cos.size(-1) == dim && sin.sizes() == cos.sizes(), "cos/sin must be (tokens, dim)");
  TORCH_CHECK(slot_mapping.size(0) == tokens, "one slot per token");
  const int64_t slots = k_cache.size(0) * k_cache.size(1);
  const int64_t* sp = slot_mapping.data_ptr<int64_t>();
  check_slots(sp, tokens, slots);
  auto q = at::empty({tokens, heads, dim}, qkv.options());
  AT_DISPATCH_REDUCED_FLOATING_TYPES(qkv.scalar_type(), "rotate_store_", [&] {
    const scalar_t* src = qkv.data_ptr<scalar_t>();
    const scalar_t* cp = cos.data_ptr<scalar_t>();
    const scalar_t* snp = sin.data_ptr<scalar_t>();
    scalar_t* qp = q.data_ptr<scalar_t>();
    scalar_t* kc = k_cache.data_ptr<scalar_t>();
    scalar_t* vc = v_cache.data_ptr<scalar_t>();
    const int64_t width = qkv.size(1), row = kv_heads * dim, half = dim / 2;
    at::parallel_for(0, tokens, 8, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const scalar_t* x = src + t * width;
        const scalar_t* c = cp + t * dim;
        const scalar_t* s = snp + t * dim;
        for (int64_t h = 0; h < heads; ++h) lmiserve::rotate_half(x + h * dim, qp + (t * heads + h) * dim, c, s, half);
        if (sp[t] < 0) continue;
        for (int64_t h = 0; h < kv_heads; ++h)
          lmiserve::rotate_half(x + (heads + h) * dim, kc + sp[t] * row + h * dim, c, s, half);
        std::memcpy(vc + sp[t] * row, x + (heads + kv_heads) * dim, row * sizeof(scalar_t));
      }
    });
  });
  return q;
}
LMISERVE_OP(rotate_store_, "(Tensor qkv, Tensor cos, Tensor sin, Tensor(a!) k_cache, Tensor(b!) v_cache, "
                           "Tensor slot_mapping, int heads) -> Tensor");

}  // namespace
