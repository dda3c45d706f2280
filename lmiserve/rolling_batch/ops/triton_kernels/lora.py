"""LoRA for a whole step: one segmented, slot-gathered matrix multiply per factor.

The step's tokens come in runs, each run's request using the adapter in one slot. A program takes
``BLOCK_M`` rows of one run and ``BLOCK_N`` output columns, reads that slot's weight straight from
the pool (nothing is gathered or copied) and accumulates over the inner dimension in fp32. The
shrink ``u = x @ A[slot].T`` writes a fresh ``u``; the expand ``y += u @ B[slot].T`` adds to the
projection's output, rounding once. Rows in no run are not touched.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .rounding import cast

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _segment_matmul_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    seg_slots_ptr,
    seg_firsts_ptr,
    seg_ends_ptr,
    K,
    N,
    stride_x,
    stride_w_slot,
    stride_w_n,
    stride_w_k,
    stride_y,
    ACCUMULATE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    HALF_DOT: tl.constexpr,
):
    seg = tl.program_id(0)
    n_block = tl.program_id(1)
    m_block = tl.program_id(2)
    first = tl.load(seg_firsts_ptr + seg)
    end = tl.load(seg_ends_ptr + seg)
    if first + m_block * BLOCK_M >= end:
        return
    slot = tl.load(seg_slots_ptr + seg).to(tl.int64)
    rows = first + m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = n_block * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < end
    col_ok = cols < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    w_base = w_ptr + slot * stride_w_slot
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        x = tl.load(
            x_ptr + rows[:, None].to(tl.int64) * stride_x + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0
        )
        w = tl.load(
            w_base + cols[None, :] * stride_w_n + ks[:, None] * stride_w_k,
            mask=col_ok[None, :] & k_ok[:, None],
            other=0.0,
        )
        if HALF_DOT:
            acc += tl.dot(x, w)
        else:
            acc += tl.dot(x.to(tl.float32), w.to(tl.float32), input_precision="ieee")
    y_ptrs = y_ptr + rows[:, None].to(tl.int64) * stride_y + cols[None, :]
    mask = row_ok[:, None] & col_ok[None, :]
    if ACCUMULATE:
        acc += tl.load(y_ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptrs, cast(acc, y_ptr.dtype.element_ty), mask=mask)


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def segment_matmul(
    x: torch.Tensor,
    w: torch.Tensor,
    y: torch.Tensor,
    segments: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    max_rows: int,
    accumulate: bool,
    transposed: bool = True,
) -> None:
    """For each run ``(slot, first, end)``: ``y[first:end] (+)= x[first:end] @ w[slot].T`` with ``w``
    ``(slots, N, K)`` (``transposed``), or ``@ w[slot]`` with ``w`` ``(slots, K, N)``; ``x`` ``(T, K)``
    and ``y`` ``(T, N)``, all row-major."""
    slots, firsts, ends = segments
    k = x.shape[1]
    n = w.shape[1] if transposed else w.shape[2]
    stride_n, stride_k = (w.stride(1), w.stride(2)) if transposed else (w.stride(2), w.stride(1))
    block_m = 16 if max_rows <= 16 else 64
    block_n = min(64, max(16, _pow2(n)))
    block_k = min(64, max(16, _pow2(k)))
    grid = (slots.shape[0], triton.cdiv(n, block_n), triton.cdiv(max_rows, block_m))
    _segment_matmul_kernel[grid](
        x,
        w,
        y,
        slots,
        firsts,
        ends,
        k,
        n,
        x.stride(0),
        w.stride(0),
        stride_n,
        stride_k,
        y.stride(0),
        ACCUMULATE=accumulate,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        HALF_DOT=x.dtype in (torch.float16, torch.bfloat16) and not INTERPRETED,
    )


def lora_add(
    y: torch.Tensor,
    x: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    segments: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    max_rows: int,
) -> None:
    """``y[rows] += (x[rows] @ a[slot].T) @ b[slot]`` per run (``a`` ``(slots, r, in)``, ``b``
    ``(slots, r, out)``): two launches for the step."""
    u = torch.empty((x.shape[0], a.shape[1]), dtype=x.dtype, device=x.device)
    segment_matmul(x, a, u, segments, max_rows, accumulate=False)
    segment_matmul(u, b, y, segments, max_rows, accumulate=True, transposed=False)
