// GGUF blocks (Q4_0, Q4_1, Q8_0) repacked once at load into the layouts the CPU kernels read: a
// row's quants, then its scales, then Q4_1's minimums. pack_gguf: csrc/gguf_layout.h (the
// kernels of csrc/quant_linear.cpp); pack_gguf_int8: csrc/gguf_lanes.h (int8 activations).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>

#include "gguf_lanes.h"
#include "gguf_layout.h"
#include "op_registration.h"

namespace {

using namespace lmiserve_gguf;

at::Tensor pack_gguf(const at::Tensor& blocks, int64_t kind, int64_t k) {
  TORCH_CHECK(kind >= kQ4_0 && kind <= kQ8_0 && k % kBlock == 0, "kind 0 (Q4_0), 1 (Q4_1) or 2 (Q8_0), K of whole blocks");
  const Layout L(kind, k);
  const int64_t bb = gguf_block_bytes(kind), n = blocks.size(0);
  TORCH_CHECK(blocks.dim() == 2 && blocks.scalar_type() == at::kByte && blocks.size(1) == L.blocks * bb,
              "blocks: uint8 (N, K / 32 * block bytes)");
  const auto src = blocks.contiguous();
  auto out = at::zeros({n, L.row_bytes}, src.options());
  const uint8_t* s = src.data_ptr<uint8_t>();
  uint8_t* o = out.data_ptr<uint8_t>();
  at::parallel_for(0, n, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* row = s + r * L.blocks * bb;
      uint8_t* q = o + r * L.row_bytes;
      uint8_t* d = q + L.quant_bytes;
      uint8_t* mins = d + 2 * L.scales;
      for (int64_t b = 0; b < L.blocks; ++b) {
        std::memcpy(d + 2 * b, row + b * bb, 2);
        if (kind == kQ4_1) std::memcpy(mins + 2 * b, row + b * bb + 2, 2);
        if (kind == kQ8_0) std::memcpy(q + b * 32, row + b * bb + 2, 32);
      }
      if (kind == kQ8_0) continue;
      const int64_t qoff = kind == kQ4_1 ? 4 : 2;
      for (int64_t p = 0; p < L.pairs; ++p)
        for (int j = 0; j < 32; ++j) {  // byte j holds the quants of arranged values j and 32 + j
          const int64_t block = 2 * p + pair_source(j) / kBlock, byte = pair_source(j) % kBlock;
          q[p * 32 + j] = block < L.blocks ? row[block * bb + qoff + byte] : 0;
        }
    }
  });
  return out;
}
LMISERVE_OP(pack_gguf, "(Tensor blocks, int kind, int k) -> Tensor");

at::Tensor pack_gguf_int8(const at::Tensor& blocks, int64_t kind, int64_t k) {
  TORCH_CHECK(kind >= kQ4_0 && kind <= kQ8_0 && k % kBlock == 0, "kind 0 (Q4_0), 1 (Q4_1) or 2 (Q8_0), K of whole blocks");
  const LanesLayout L(kind, k);
  const int64_t bb = gguf_block_bytes(kind), n = blocks.size(0), sets = LanesLayout::sets(n);
  TORCH_CHECK(blocks.dim() == 2 && blocks.scalar_type() == at::kByte && blocks.size(1) == L.blocks * bb,
              "blocks: uint8 (N, K / 32 * block bytes)");
  const auto src = blocks.contiguous();
  auto out = at::zeros({sets, L.set_bytes}, src.options());
  const uint8_t* s = src.data_ptr<uint8_t>();
  uint8_t* o = out.data_ptr<uint8_t>();
  const int64_t qoff = kind == kQ4_1 ? 4 : 2;
  at::parallel_for(0, sets, 8, [&](int64_t s0, int64_t s1) {
    for (int64_t set = s0; set < s1; ++set) {
      uint8_t* q = o + set * L.set_bytes;
      uint8_t* d = q + L.quant_bytes;
      uint8_t* mins = d + 2 * L.groups * kLanes;
      for (int64_t r = 0; r < std::min(kSetRows, n - set * kSetRows); ++r)
        for (int64_t b = 0; b < L.blocks; ++b) {
          const uint8_t* block = s + (set * kSetRows + r) * L.blocks * bb + b * bb;
          const int64_t j = b / kGroup, lane = r * kGroup + b % kGroup;
          std::memcpy(d + 2 * (j * kLanes + lane), block, 2);
          if (kind == kQ4_1) std::memcpy(mins + 2 * (j * kLanes + lane), block + 2, 2);
          for (int64_t t = 0; t < L.runs; ++t)
            std::memcpy(q + ((j * L.runs + t) * kLanes + lane) * 4, block + qoff + 4 * t, 4);
        }
    }
  });
  return out;
}
LMISERVE_OP(pack_gguf_int8, "(Tensor blocks, int kind, int k) -> Tensor");

}  // namespace
