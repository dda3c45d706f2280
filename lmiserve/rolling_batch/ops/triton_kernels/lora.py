"""LoRA for a whole step: two launches per projection, sized so that a captured graph serves
every step.

The step's adapted rows are listed slot by slot (:class:`..metadata.LoraIndex`): segment ``i``
is slot ``slots[i]`` over ``rows[firsts[i]:ends[i]]``. Each launch's grid is ``(segments, column
blocks, row programs)``: the segments are a fixed number (a graph's: ``max_loras``), the row
programs are sized by a host bound on a segment's rows (a graph's bucket) and each walks its
segment's row blocks with a stride, so the grid never depends on what the step holds. Empty
segments (``first == end``) and programs past their segment's rows return at once; rows in no
segment (requests without an adapter, a bucket's padding) are not touched.

- The shrink ``u = x @ A[slot].T`` has few columns (``parts * rank``) and a long inner
  dimension, so that dimension is split across programs at fixed bounds: each writes its fp32
  partial sums into the step's workspace (``(row, split, column)``), without atomics.
- The expand ``y += u @ B[slot]`` first adds a row's partial sums in split order (so a row's
  ``u`` never depends on the rest of the step), rounds ``u`` to the activation dtype as a
  separate product would, then accumulates over the rank in fp32 and adds ``y``, rounding once.

The tile sizes are constants, and every integer argument is fixed by the model's shapes: one
compiled kernel per projection shape serves every step, eager or captured.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..metadata import LORA_MAX_SPLIT_K, LoraIndex
from .products import fp32_dot, half_dot
from .rounding import cast

BLOCK_M = 16
"""Rows per tile, in every step (a decode batch's segments are short)."""
BLOCK_N = 64
"""Output columns per expand program."""
BLOCK_K = 64
"""Inner-dimension tile of the shrink."""
SPLIT_CHUNK = 512
"""The shrink's inner dimension per program is at least this (rounded up to whole tiles)."""
MAX_SPLIT_K = LORA_MAX_SPLIT_K
"""The most programs the shrink's inner dimension is split across (a workspace holds this many
partial sums per row and column)."""
MAX_ROW_PROGRAMS = 8
"""Programs per segment and column block along the rows: a longer segment's row blocks are
walked in turn, so a large bucket launches no more programs than this many."""


@triton.jit
def _segment(slots_ptr, firsts_ptr, ends_ptr, BLOCK_M: tl.constexpr):
    """This program's segment (the first axis of the grid): where its first row block starts in
    the row index (the grid's third axis takes every that-many-th block: the step between them),
    where the segment ends, and its slot."""
    step = tl.num_programs(2) * BLOCK_M
    seg = tl.program_id(0)
    first, end, slot = tl.load(firsts_ptr + seg), tl.load(ends_ptr + seg), tl.load(slots_ptr + seg).to(tl.int64)
    return first + tl.program_id(2) * BLOCK_M, end, step, slot


@triton.jit
def _row_block(rows_ptr, start, end, BLOCK_M: tl.constexpr):
    """The row block at ``start`` of the row index: its positions, which of them are the
    segment's (before ``end``), and the rows of ``x`` and ``y`` they name."""
    pos = start + tl.arange(0, BLOCK_M)
    ok = pos < end
    return pos, ok, tl.load(rows_ptr + pos, mask=ok, other=0).to(tl.int64)


@triton.jit
def _shrink_kernel(
    x_ptr,
    a_ptr,
    ws_ptr,
    slots_ptr,
    firsts_ptr,
    ends_ptr,
    rows_ptr,
    K,
    N,
    K_PER_SPLIT,
    stride_x,
    stride_a_slot,
    stride_a_n,
    stride_ws,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    HALF_DOT: tl.constexpr,
):
    split = tl.program_id(1)
    start0, end, step, slot = _segment(slots_ptr, firsts_ptr, ends_ptr, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < N
    a_base = a_ptr + slot * stride_a_slot
    k_lo = split * K_PER_SPLIT
    for start in range(start0, end, step):
        pos, ok, rows = _row_block(rows_ptr, start, end, BLOCK_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K_PER_SPLIT, BLOCK_K):
            ks = k_lo + k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < K
            x = tl.load(x_ptr + rows[:, None] * stride_x + ks[None, :], mask=ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(
                a_base + cols[None, :] * stride_a_n + ks[:, None], mask=col_ok[None, :] & k_ok[:, None], other=0.0
            )
            acc += fp32_dot(x, w, HALF_DOT)
        ws = ws_ptr + pos[:, None].to(tl.int64) * stride_ws + split * N + cols[None, :]
        tl.store(ws, acc, mask=ok[:, None] & col_ok[None, :])


@triton.jit
def _expand_kernel(
    ws_ptr,
    b_ptr,
    y_ptr,
    slots_ptr,
    firsts_ptr,
    ends_ptr,
    rows_ptr,
    R,
    N,
    SPLITS,
    PART_RANK,
    PART1,
    PART2,
    stride_ws,
    stride_b_slot,
    stride_b_r,
    stride_y,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    HALF_DOT: tl.constexpr,
):
    n_block = tl.program_id(1)
    start0, end, step, slot = _segment(slots_ptr, firsts_ptr, ends_ptr, BLOCK_M)
    cols = n_block * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    b_base = b_ptr + slot * stride_b_slot
    # B's rows of the parts these columns belong to (a fused projection's other rows are zeros here)
    c0 = n_block * BLOCK_N
    c1 = tl.minimum(c0 + BLOCK_N, N) - 1
    r_lo = ((c0 >= PART1).to(tl.int32) + (c0 >= PART2).to(tl.int32)) * PART_RANK
    r_hi = tl.minimum(((c1 >= PART1).to(tl.int32) + (c1 >= PART2).to(tl.int32) + 1) * PART_RANK, R)
    for start in range(start0, end, step):
        pos, ok, rows = _row_block(rows_ptr, start, end, BLOCK_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for r0 in range(r_lo, r_hi, BLOCK_R):
            rs = r0 + tl.arange(0, BLOCK_R)
            r_ok = rs < r_hi
            u_mask = ok[:, None] & r_ok[None, :]
            u_ptrs = ws_ptr + pos[:, None].to(tl.int64) * stride_ws + rs[None, :]
            u = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
            for s in range(0, SPLITS):  # the partial sums in split order: the same for every row
                u += tl.load(u_ptrs + s * R, mask=u_mask, other=0.0)
            u = cast(u, y_ptr.dtype.element_ty)  # u in the activation dtype, as a product of its own
            w = tl.load(
                b_base + rs[:, None] * stride_b_r + cols[None, :], mask=r_ok[:, None] & col_ok[None, :], other=0.0
            )
            acc += fp32_dot(u, w, HALF_DOT)
        y_ptrs = y_ptr + rows[:, None] * stride_y + cols[None, :]
        mask = ok[:, None] & col_ok[None, :]
        acc += tl.load(y_ptrs, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptrs, cast(acc, y_ptr.dtype.element_ty), mask=mask)


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def split_k(k: int) -> tuple[int, int]:
    """``(splits, inner dimension per split)`` of the shrink over an inner dimension ``k``: fixed
    by ``k`` alone, so a row's partial sums cover the same columns in every step."""
    splits = max(1, min(MAX_SPLIT_K, triton.cdiv(k, SPLIT_CHUNK)))
    per = triton.cdiv(triton.cdiv(k, splits), BLOCK_K) * BLOCK_K
    return triton.cdiv(k, per), per


def row_programs(max_rows: int) -> int:
    """Programs along the rows for segments of up to ``max_rows`` rows."""
    return max(1, min(MAX_ROW_PROGRAMS, triton.cdiv(max_rows, BLOCK_M)))


def workspace_floats(rows: int, rank_width: int, k: int) -> int:
    """Floats of workspace the shrink of ``rows`` rows over inner dimension ``k`` writes."""
    return rows * split_k(k)[0] * rank_width


def _part_bounds(parts: tuple[int, ...] | None, r: int, n: int) -> tuple[int, int, int]:
    """``(rank per part, first column of part 1, of part 2)`` (columns past ``n`` where there are
    fewer parts); one part of rank ``r`` without the hint."""
    if parts is None or len(parts) < 2 or len(parts) > 4 or r % (len(parts) - 1):
        return r, n, n
    inner = [*parts[1:-1], n, n]
    return r // (len(parts) - 1), inner[0], inner[1]


def lora_add(
    y: torch.Tensor,
    x: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    index: LoraIndex,
    parts: tuple[int, ...] | None = None,
) -> None:
    """``y[rows] += (x[rows] @ a[slot].T) @ b[slot]`` for each segment of ``index`` (``a``
    ``(slots, r, in)``, ``b`` ``(slots, r, out)``, ``x`` and ``y`` row-major): two launches, whose
    grids depend on ``index``'s fixed sizes and the shapes only. ``parts`` (the pool's hint: B's
    column bounds of a fused projection's parts, part ``p`` nonzero only in its own rows) lets
    the expand read only each column block's own rows of B; the sums are the same without it."""
    k, r, n = x.shape[1], a.shape[1], b.shape[2]
    assert a.stride(2) == 1 and b.stride(2) == 1 and x.stride(1) == 1 and y.stride(1) == 1
    splits, per_split = split_k(k)
    rows_total = index.rows.shape[0]
    ws = index.scratch(rows_total * splits * r)
    segments = index.slots.shape[0]
    programs = row_programs(index.max_rows)
    half = half_dot(x.dtype)
    shared = (index.slots, index.firsts, index.ends, index.rows)
    _shrink_kernel[(segments, splits, programs)](
        x, a, ws, *shared, k, r, per_split, x.stride(0), a.stride(0), a.stride(1), splits * r,
        BLOCK_M=BLOCK_M, BLOCK_N=max(16, _pow2(r)), BLOCK_K=BLOCK_K, HALF_DOT=half,
    )  # fmt: skip
    _expand_kernel[(segments, triton.cdiv(n, BLOCK_N), programs)](
        ws, b, y, *shared, r, n, splits, *_part_bounds(parts, r, n), splits * r, b.stride(0), b.stride(1), y.stride(0),
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_R=min(64, max(16, _pow2(r))), HALF_DOT=half,
    )  # fmt: skip
