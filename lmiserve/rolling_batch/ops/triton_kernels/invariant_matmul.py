"""A matrix multiply whose rows do not depend on the batch: ``y = x @ W.T (+ bias)`` in one launch.

cuBLAS picks its kernel, tile sizes and split of the inner dimension by the shape of the
product, so a row's sums are added in another order when the step has more rows. Here there is
one configuration for every shape (:data:`BLOCK_M`, :data:`BLOCK_N`, :data:`BLOCK_K`,
:data:`NUM_WARPS`, :data:`NUM_STAGES`; no autotuning, no split of the inner dimension): a
program computes one ``BLOCK_M x BLOCK_N`` tile, accumulating in fp32 over ``K`` in
``BLOCK_K`` steps from 0 up, then adds the bias and rounds once. An output element is the same
sequence of operations on the same operands wherever its row sits and whatever the other rows
hold (under Triton's interpreter too: :mod:`.products`), so its bits depend on its own row alone.

Programs are ordered in groups of :data:`GROUP_M` row tiles: consecutive programs take the
row tiles of a group against one column tile before moving to the next, so a tile of ``W``
read from memory serves the whole group from L2. The launch is sized by the tensors' shapes
(host integers): no device value is read and nothing is allocated but the output, so it can be
captured in a CUDA graph, and ``M`` is not specialised on, so one compiled kernel serves every
number of rows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .products import fp32_dot, half_dot
from .rounding import cast

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


@triton.jit
def grouped_tile(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Program ``pid``'s output tile ``(m_tile, n_tile)`` in grouped order: GROUP_M row tiles
    walk the column tiles together, so their weight columns are read while still cached."""
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    return first_m + (pid % per_group) % group_rows, (pid % per_group) // group_rows


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
    m_tile, n_tile = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)

    rows = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = n_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < N
    x_rows = x_ptr + rows[:, None].to(tl.int64) * stride_x
    w_cols = w_ptr + cols[None, :].to(tl.int64) * stride_w
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        x = tl.load(x_rows + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_cols + ks[:, None], mask=col_ok[None, :] & k_ok[:, None], other=0.0)
        acc += fp32_dot(x, w, HALF_DOT)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    y_ptrs = y_ptr + rows[:, None].to(tl.int64) * stride_y + cols[None, :]
    tl.store(y_ptrs, cast(acc, y_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def invariant_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T + bias`` for ``x`` ``(..., K)`` and ``weight`` ``(N, K)``, in ``x``'s dtype;
    each row's bits are the same in a product of any number of rows."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
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
