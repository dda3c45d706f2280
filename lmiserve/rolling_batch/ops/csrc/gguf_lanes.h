// GGUF blocks as the int8-activation kernel keeps them (csrc/quant_linear_int8.cpp): weight rows
// in sets of 8, one (row, block) a 32-bit lane, so that an integer dot product of four bytes a lane
// (vpdpbusd, or pmaddubsw) leaves each block's sum in a lane of its own, the scales are applied
// once per kGroup blocks of all 8 rows, and a set's 8 outputs come out of one vector.
//
// A set of 8 rows (the last one padded with zero rows), K = 32 nb inputs, repacked once at load:
//   quants  the blocks kGroup at a time (a group; the last padded with zero blocks): `runs` runs of
//           8 kGroup lanes of 4 bytes, lane l holding row l / kGroup's block kGroup j + l % kGroup,
//           run t its quant bytes 4t..4t+3: Q4 (4 runs) the file's own bytes (low nibble quant i,
//           high nibble quant i + 16, of byte i), Q8_0 (8 runs) the int8 quants.
//   d       the fp16 scales in the lanes' order, group after group; m: Q4_1 only, the minimums.
// x is quantized to int8 and arranged to match (csrc/quant_linear_int8.cpp): per group, 8 runs of
// the group's blocks' 4 inputs each (Q4 run 2t: inputs 4t..4t+3, run 2t + 1: 16 + 4t..; Q8_0 run
// t: 4t..), which one broadcast load spreads over the 8 rows' lanes.

#pragma once

#include <cstdint>

#include "gguf_layout.h"

namespace lmiserve_gguf {

#if defined(__AVX512F__) || !defined(__AVX2__)
constexpr int64_t kGroup = 2;  // blocks a group: 16 lanes
#else
constexpr int64_t kGroup = 1;  // 8 lanes
#endif
constexpr int64_t kSetRows = 8;
constexpr int64_t kLanes = kGroup * kSetRows;

struct LanesLayout {
  int64_t kind, k, blocks, groups, runs;  // runs: of quant bytes a group (4 Q4, 8 Q8_0)
  int64_t quant_bytes, set_bytes;

  LanesLayout(int64_t kind_, int64_t k_) : kind(kind_), k(k_), blocks(k_ / kBlock) {
    groups = (blocks + kGroup - 1) / kGroup;
    runs = kind == kQ8_0 ? 8 : 4;
    quant_bytes = groups * runs * kLanes * 4;
    set_bytes = quant_bytes + 2 * groups * kLanes * (kind == kQ4_1 ? 2 : 1);
  }
  static int64_t sets(int64_t n) { return (n + kSetRows - 1) / kSetRows; }
  int64_t x_row() const { return groups * 8 * kGroup * 4; }  // arranged int8 x a row
  int64_t x_scales() const { return groups * kGroup; }       // per-block values a row
};

}  // namespace lmiserve_gguf
