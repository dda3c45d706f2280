// How the GGUF-block kernels (csrc/quant_linear.cpp) walk a product
// y (m, n) = x W^T: threads take units of groups of R weight rows (csrc/task_queue.h), each
// group's rows against up to M x rows at a time, the weight rows a few groups on requested from
// memory while these are used. A row's sums come from the same code whatever the batch.

#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "gguf_layout.h"
#include "task_queue.h"

namespace lmiserve_gguf {

constexpr int64_t kAheadGroups = 4;  // how far ahead a thread requests its groups' weight rows
constexpr int64_t kUnitGroups = 8;   // groups a thread takes at a time (csrc/task_queue.h)

// w: n rows of row_bytes. rows(tag, wr, m0, mr, s): the sums of weight rows wr (tag: std::integral_constant<int, R>, or
// 1 for the last rows of a matrix whose row count R does not divide) against x rows m0 to
// m0 + mr - 1 (mr <= M), into s[r * mr + i]. Each is written to y with the bias added.
template <int R, int M, typename Y, typename Rows>
void for_row_groups(int64_t m, const uint8_t* w, int64_t row_bytes, int64_t n, const float* bias, Y* y,
                    const Rows& rows) {
  const int64_t groups = (n + R - 1) / R;
  lmiserve::for_each_unit((groups + kUnitGroups - 1) / kUnitGroups, [&](auto take) {
    float s[R * M];
    for (lmiserve::Taken u = take(); u.unit >= 0; u = take()) {
      // this unit's groups; the weight rows kAheadGroups groups on are requested while these are
      // used, up to the end of the run of units that is likely this thread's
      const int64_t g1 = std::min(groups, (u.unit + 1) * kUnitGroups);
      const int64_t ahead_end = std::min(groups, u.end * kUnitGroups);
      for (int64_t g = u.unit * kUnitGroups; g < g1; ++g) {
        const int64_t n0 = g * R, count = std::min<int64_t>(R, n - n0);
        if (g + kAheadGroups < ahead_end) prefetch_bytes(w + (n0 + kAheadGroups * R) * row_bytes, R * row_bytes);
        for (int64_t m0 = 0; m0 < m; m0 += M) {
          const int64_t mr = std::min<int64_t>(M, m - m0);
          for (int64_t r0 = 0; r0 < count; r0 += (count == R ? R : 1)) {
            const int64_t rr = count == R ? R : 1;
            const uint8_t* wr = w + (n0 + r0) * row_bytes;
            if (rr == R) rows(std::integral_constant<int, R>{}, wr, m0, mr, s);
            else rows(std::integral_constant<int, 1>{}, wr, m0, mr, s);
            for (int64_t r = 0; r < rr; ++r)
              for (int64_t i = 0; i < mr; ++i) {
                const int64_t col = n0 + r0 + r;
                y[(m0 + i) * n + col] = static_cast<Y>(s[r * mr + i] + (bias ? bias[col] : 0.f));
              }
          }
        }
      }
    }
  });
}

}  // namespace lmiserve_gguf
