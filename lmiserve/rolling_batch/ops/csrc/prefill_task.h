// The unit of work of the prefill attention kernels: up to 16 query rows of one sequence and
// one KV head, with the query heads that share it.

#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>
#include <vector>

namespace lmiserve {

struct PrefillTask {
  int64_t seq, kv_head, row0, rows;
};

constexpr int64_t kPrefillRows = 16;  // query rows per task

// The shapes of one call: q (T, H, D), caches (blocks, block_size, KVH, D), out like q.
struct PrefillShape {
  int64_t heads, kv_heads, dim, block_size, max_blocks;
  int64_t q_stride_t, q_stride_h, out_stride_t, out_stride_h;
  float scale;
  int64_t window;
};

// bf16 prompts with vdpbf16ps (prefill_attention_bf16.cpp); false when this CPU build or these
// shapes are not covered (the caller then runs the fp32 path).
bool prefill_bf16(c10::BFloat16* out, const c10::BFloat16* q, const c10::BFloat16* k_cache,
                  const c10::BFloat16* v_cache, const int32_t* block_tables, const int32_t* cu_q_lens,
                  const int32_t* seq_lens, const std::vector<PrefillTask>& tasks, const PrefillShape& shape);

}  // namespace lmiserve
