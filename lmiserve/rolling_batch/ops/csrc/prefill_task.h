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

// Where a task's queries sit: its first row of q (and of out), that row's position in the
// sequence, the sequence's length (keys in the cache) and its block table; the first and last
// key any of its rows sees.
struct TaskRows {
  int64_t row_lo, pos0, len, first_key, last_key;
  const int32_t* table;
};

inline TaskRows task_rows(const PrefillTask& task, const int32_t* cu_q_lens, const int32_t* seq_lens,
                          const int32_t* block_tables, int64_t max_blocks, int64_t window) {
  const int64_t len = seq_lens[task.seq];
  const int64_t pos0 = len - (cu_q_lens[task.seq + 1] - cu_q_lens[task.seq]) + task.row0;
  const int64_t first = window > 0 ? (pos0 - window + 1 > 0 ? pos0 - window + 1 : 0) : 0;
  return {cu_q_lens[task.seq] + task.row0, pos0, len, first, pos0 + task.rows - 1, block_tables + task.seq * max_blocks};
}

// The shapes of one call: q (T, H, D), caches (blocks, block_size, KVH, D), out like q.
struct PrefillShape {
  int64_t heads, kv_heads, dim, block_size, max_blocks;
  int64_t q_stride_t, q_stride_h, out_stride_t, out_stride_h;
  float scale;
  int64_t window;
  float softcap = 0.f;  // scores capped as tanh(s / softcap) * softcap; 0: not capped
};

// A prefill kernel over all the tasks of one call (prefill_attention_bf16.cpp, _amx.cpp).
using PrefillKernel = void (*)(c10::BFloat16*, const c10::BFloat16*, const c10::BFloat16*, const c10::BFloat16*,
                               const int32_t*, const int32_t*, const int32_t*, const std::vector<PrefillTask>&,
                               const PrefillShape&);

// The bf16 prompt kernel for head_dim `dim` and `group` (1 to 8) query heads per KV head (caches in
// blocks of a multiple of 16 tokens): with vdpbf16ps (prefill_attention_bf16.cpp), or on AMX tiles
// where the operating system grants them (prefill_attention_amx.cpp); nullptr where this CPU
// build does not cover those shapes (the caller then runs the fp32 path).
PrefillKernel bf16_prefill_kernel(int64_t dim, int64_t group);
PrefillKernel amx_prefill_kernel(int64_t dim, int64_t group);

}  // namespace lmiserve
