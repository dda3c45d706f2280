// LoRA for a whole step on AMX tiles, in one call per projection (bf16).
//
// Each slot's A (width x in) and B^T (out x width, its width padded with zero columns to whole
// tiles) are packed once as weights of the linear kernel (csrc/linear.cpp's packing), stacked by
// slot. A run of rows (slot, first, end) is then two tile products: u = x A^T, whose fp32 sums are
// rounded to bf16 as a bf16 product would be, then u B^T, rounded and added to y and rounded again,
// as `y += u @ B` in bf16 does. Threads share the runs and the 48-column groups of each product.
//
// Rows are formed from their own x row and their slot's weights alone, in the order of k, so a row's
// result does not depend on the other rows of the step (deterministic mode).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <vector>

#include "linear_tile.h"
#include "op_registration.h"

namespace {

using namespace lmiserve_linear;

bool lora_tiles_supported() {
#if defined(LMISERVE_AMX)
  return amx_usable();
#else
  return false;
#endif
}

void lora_tiles_(at::Tensor y, const at::Tensor& x, const at::Tensor& a_packed, const at::Tensor& b_packed,
                 const at::Tensor& runs, int64_t width) {
  TORCH_CHECK(lora_tiles_supported(), "lora_tiles_ needs AMX tiles (kernels built for them, granted by the OS)");
  TORCH_CHECK(y.scalar_type() == at::kBFloat16 && x.scalar_type() == at::kBFloat16 &&
                  a_packed.scalar_type() == at::kBFloat16 && b_packed.scalar_type() == at::kBFloat16,
              "lora_tiles_ takes bf16");
  TORCH_CHECK(y.is_contiguous() && x.is_contiguous() && a_packed.is_contiguous() && b_packed.is_contiguous(),
              "lora_tiles_: contiguous inputs only");
  TORCH_CHECK(a_packed.dim() == 5 && b_packed.dim() == 5 && a_packed.size(3) == kCols && b_packed.size(3) == kCols,
              "lora_tiles_: A and B^T packed by pack_linear_bf16, stacked by slot");
  const int64_t m = x.size(0), in = x.size(1), out = y.size(1), slots = a_packed.size(0);
  const int64_t in_pairs = a_packed.size(2), w_pairs = b_packed.size(2);
  TORCH_CHECK(y.size(0) == m && in_pairs * 2 == in && in % 32 == 0, "lora_tiles_: x must have A's (whole tiles of) k");
  TORCH_CHECK(w_pairs % 16 == 0 && 2 * w_pairs >= width && a_packed.size(1) * kCols >= width,
              "lora_tiles_: width does not fit the packing");
  TORCH_CHECK(b_packed.size(0) == slots && b_packed.size(1) * kCols >= out, "lora_tiles_: B^T must cover y's columns");
  const auto r = runs.contiguous().to(at::kLong);
  TORCH_CHECK(r.dim() == 2 && r.size(1) == 3, "lora_tiles_: runs are (slot, first, end)");
  const int64_t count = r.size(0);
  const int64_t* rp = r.data_ptr<int64_t>();
  for (int64_t i = 0; i < count; ++i)
    TORCH_CHECK(rp[3 * i] >= 0 && rp[3 * i] < slots && rp[3 * i + 1] >= 0 && rp[3 * i + 1] <= rp[3 * i + 2] &&
                    rp[3 * i + 2] <= m,
                "lora_tiles_: a run out of range");
#if defined(LMISERVE_AMX)
  const int64_t wp = 2 * w_pairs, groups_a = a_packed.size(1), groups_b = b_packed.size(1);
  const int64_t a_group = in_pairs * kCols * 2, b_group = w_pairs * kCols * 2;
  auto u = at::zeros({m, wp}, x.options());  // padding columns stay zero
  const auto* xs = reinterpret_cast<const uint16_t*>(x.data_ptr());
  const auto* as = reinterpret_cast<const uint16_t*>(a_packed.data_ptr());
  const auto* bs = reinterpret_cast<const uint16_t*>(b_packed.data_ptr());
  auto* us = reinterpret_cast<uint16_t*>(u.data_ptr());
  auto* ys = reinterpret_cast<uint16_t*>(y.data_ptr());
  // task t: run t / groups of product's group t % groups
  const auto product = [&](int64_t groups, auto&& one) {
    at::parallel_for(0, count * groups, 1, [&](int64_t t0, int64_t t1) {
      configure_tiles();
      RowScratch scratch;
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t* run = rp + 3 * (t / groups);
        if (run[2] > run[1]) one(run[0], run[1], run[2] - run[1], t % groups, scratch);
      }
      _tile_release();
    });
  };
  product(groups_a, [&](int64_t slot, int64_t first, int64_t rows, int64_t g, RowScratch& scratch) {
    const TileOut to{us + first * wp + g * kCols, wp, std::min(kCols, width - g * kCols), nullptr, nullptr,
                     true, true, kPlain, 0};
    if (to.cols > 0) amx_rows(xs + first * in, in, rows, as + (slot * groups_a + g) * a_group, in_pairs, to, scratch);
  });
  product(groups_b, [&](int64_t slot, int64_t first, int64_t rows, int64_t g, RowScratch& scratch) {
    const TileOut to{ys + first * out + g * kCols, out, std::min(kCols, out - g * kCols), nullptr, nullptr,
                     true, true, kAdd, 0};
    if (to.cols > 0) amx_rows(us + first * wp, wp, rows, bs + (slot * groups_b + g) * b_group, w_pairs, to, scratch);
  });
#endif
}
LMISERVE_OP(lora_tiles_, "(Tensor(a!) y, Tensor x, Tensor a_packed, Tensor b_packed, Tensor runs, int width) -> ()");

}  // namespace
