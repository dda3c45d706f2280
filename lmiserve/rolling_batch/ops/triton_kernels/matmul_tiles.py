"""The output tiles of the matrix-multiply kernels (:mod:`.invariant_matmul`, :mod:`.int4_matmul`,
:mod:`.fp8_matmul`): which ``BLOCK_M x BLOCK_N`` tile of ``y = x @ W.T`` a program computes, its
rows of ``x`` a step of the inner dimension at a time, and its store.

Programs are ordered in groups of ``GROUP_M`` row tiles: consecutive programs take the row tiles
of a group against one column tile before moving to the next, so a tile of ``W`` read from
memory serves the whole group from L2.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .rounding import cast


def as_rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` ``(..., K)`` as the ``(rows, K)`` the kernels read: its leading dimensions flattened,
    a row's values next to each other."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


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


@triton.jit
def output_tile(x_ptr, stride_x, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """This program's tile (the grid's first axis, in grouped order): its rows and columns, which
    of them exist, and where its rows of ``x`` start."""
    m_tile, n_tile = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rows = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = n_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    return rows, cols, rows < M, cols < N, x_ptr + rows[:, None].to(tl.int64) * stride_x


@triton.jit
def x_step(x_rows, row_ok, k0, k_end, BLOCK_K: tl.constexpr):
    """The inner dimension's step from ``k0`` (those below ``k_end`` exist) and the tile's rows of
    ``x`` there (zeros where a row or a ``k`` does not exist)."""
    ks = k0 + tl.arange(0, BLOCK_K)
    k_ok = ks < k_end
    return ks, k_ok, tl.load(x_rows + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)


@triton.jit
def store_tile(y_ptr, stride_y, acc, bias_ptr, rows, cols, row_ok, col_ok, HAS_BIAS: tl.constexpr):
    """The tile's fp32 sums, the bias added, rounded once to ``y``'s dtype."""
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    y_ptrs = y_ptr + rows[:, None].to(tl.int64) * stride_y + cols[None, :]
    tl.store(y_ptrs, cast(acc, y_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])
