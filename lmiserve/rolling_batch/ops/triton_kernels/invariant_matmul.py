"""A matrix multiply whose rows do not depend on the batch: ``y = x @ W.T (+ bias)`` in one launch.

cuBLAS picks its kernel, tile sizes and split of the inner dimension by the shape of the
product, so a row's sums are added in another order when the step has more rows. Here there is
one configuration for every shape (:data:`BLOCK_M`, :data:`BLOCK_N`, :data:`BLOCK_K`,
:data:`NUM_WARPS`, :data:`NUM_STAGES`; no autotuning, no split of the inner dimension): a
program computes one ``BLOCK_M x BLOCK_N`` tile, accumulating in fp32 over ``K`` in
``BLOCK_K`` steps from 0 up, then adds the bias and rounds once. An output element is the same
sequence of operations on the same operands wherever its row sits and whatever the other rows
hold (under Triton's interpreter too: :mod:`.products`), so its bits depend on its own row alone.

Programs are ordered in groups of :data:`GROUP_M` row tiles (:mod:`.matmul_tiles`). The launch
is sized by the tensors' shapes (host integers): no device value is read and nothing is
allocated but the output, so it can be captured in a CUDA graph, and ``M`` is not specialised
on, so one compiled kernel serves every number of rows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .matmul_tiles import as_rows, output_tile, store_tile, x_step
from .products import fp32_dot, half_dot

BLOCK_M = 64
"""Rows a program: the smallest tile of Hopper's warp-group matrix instructions."""
BLOCK_N = 64
"""Output columns a program: small enough that a decode step's product still spreads over
the GPU (4,096 columns are 64 programs) without a split of the inner dimension."""
BLOCK_K = 64
"""Inner-dimension step of the fp32 accumulation."""
GROUP_M = 8
"""Row tiles that take each column tile in turn (L2 reuse of the weight's tiles)."""
NUM_WARPS = 4
NUM_STAGES = 3


@triton.jit(do_not_specialize=["M"])
def _invariant_matmul_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    y_ptr,
    M,
    N,
    K,
    stride_x,
    stride_w,
    stride_y,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    HALF_DOT: tl.constexpr,
):
    rows, cols, row_ok, col_ok, x_rows = output_tile(x_ptr, stride_x, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    w_cols = w_ptr + cols[None, :].to(tl.int64) * stride_w
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks, k_ok, x = x_step(x_rows, row_ok, k0, K, BLOCK_K)
        w = tl.load(w_cols + ks[:, None], mask=col_ok[None, :] & k_ok[:, None], other=0.0)
        acc += fp32_dot(x, w, HALF_DOT)
    store_tile(y_ptr, stride_y, acc, bias_ptr, rows, cols, row_ok, col_ok, HAS_BIAS)


def invariant_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T + bias`` for ``x`` ``(..., K)`` and ``weight`` ``(N, K)``, in ``x``'s dtype;
    each row's bits are the same in a product of any number of rows."""
    shape = x.shape
    x2 = as_rows(x)
    if weight.stride(-1) != 1:
        weight = weight.contiguous()
    m, k = x2.shape
    n = weight.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return y.view(*shape[:-1], n)
    grid = (triton.cdiv(m, BLOCK_M) * triton.cdiv(n, BLOCK_N),)
    _invariant_matmul_kernel[grid](
        x2,
        weight,
        weight if bias is None else bias,
        y,
        m,
        n,
        k,
        x2.stride(0),
        weight.stride(0),
        y.stride(0),
        HAS_BIAS=bias is not None,
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        BLOCK_K=BLOCK_K,
        GROUP_M=GROUP_M,
        HALF_DOT=half_dot(x.dtype),
        num_warps=NUM_WARPS,
        num_stages=NUM_STAGES,
    )
    return y.view(*shape[:-1], n)
