"""``y = x @ W.T (+ bias)`` for 4-bit weights (:class:`~lmiserve.rolling_batch.quant.weights.Int4Weight`).

The weights are dequantized in the kernel, one ``BLOCK_K x BLOCK_N`` tile at a time: the
nibbles of ``qweight`` unpacked, the group's zero point subtracted and its scale multiplied in
fp32 (the group looked up per input row through ``g_idx`` for GPTQ's act-order checkpoints,
else ``k // group_size``; one scale row per tile when the tile lies in one group), then rounded
to ``x``'s dtype, exactly as :meth:`Int4Weight.dequantize` followed by ``.to(x.dtype)`` does.
The product accumulates in fp32 and is rounded once to ``x``'s dtype.

Two configurations, chosen on the host from the shapes alone (:func:`int4_config`):

- decode (``M <= DECODE_ROWS``): small row tiles and a split of the inner dimension into a
  fixed number of parts (from ``N`` and ``K``: enough programs to fill the GPU). Each part
  writes its fp32 partial sums to a workspace; a second launch adds the parts in order 0, 1, ...
  then the bias, and rounds. No atomics: the result is deterministic for a given ``M``.
- otherwise: ``BLOCK_M x BLOCK_N`` tiles over the whole inner dimension in one launch.

Deterministic mode (``invariant=True``) takes the second configuration for every ``M``: a row's
sums are then formed in one order whatever the other rows, as in :mod:`.invariant_matmul`.

Launches are sized by host integers only and allocate only the output (and the workspace, sized
by the shapes), so they can be captured in CUDA graphs; ``M`` is not specialised on. The compiled
variants a weight can reach are those of :func:`int4_variants`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .matmul_tiles import as_rows, output_tile, store_tile, x_step
from .products import fp32_dot, half_dot
from .rounding import cast

DECODE_ROWS = 16
"""Rows up to which the split configuration is taken (a decode step of up to 16 sequences)."""
TARGET_PROGRAMS = 256
"""Programs a split launch aims for (about two per SM of an H100)."""
MAX_SPLIT = 16


@dataclass(frozen=True)
class Int4Config:
    block_m: int
    block_n: int
    block_k: int
    split_k: int
    """Parts of the inner dimension; 1: no split, no workspace."""
    k_per_split: int
    num_warps: int = 4
    num_stages: int = 3


def _block_k(group_size: int) -> int:
    # a tile inside one group where the groups allow it (one scale row per tile)
    return 32 if group_size == 32 else 64


def int4_config(m: int, n: int, k: int, group_size: int, invariant: bool = False) -> Int4Config:
    """The configuration for ``M`` rows of a ``(N, K)`` weight: a function of the shapes only."""
    block_k = _block_k(group_size)
    if invariant or m > DECODE_ROWS:
        return Int4Config(64, 64, block_k, 1, k)
    block_n = 64
    k_tiles = triton.cdiv(k, block_k)
    split = max(1, min(k_tiles, MAX_SPLIT, TARGET_PROGRAMS // triton.cdiv(n, block_n)))
    tiles_per_split = triton.cdiv(k_tiles, split)
    split = triton.cdiv(k_tiles, tiles_per_split)  # no empty part
    return Int4Config(16, block_n, block_k, split, tiles_per_split * block_k)


def int4_variants(n: int, k: int, group_size: int, invariant: bool = False) -> list[tuple[int, Int4Config]]:
    """Every configuration a ``(N, K)`` weight can run with, each with a row count that reaches
    it: calling :func:`int4_linear` once with that many rows compiles that variant (for the
    weight's dtype of ``x``, bias and ``g_idx`` presence)."""
    if invariant:
        return [(1, int4_config(1, n, k, group_size, True))]
    return [(1, int4_config(1, n, k, group_size)), (DECODE_ROWS + 1, int4_config(DECODE_ROWS + 1, n, k, group_size))]


@triton.jit(do_not_specialize=["M"])
def _int4_matmul_kernel(
    x_ptr,
    qw_ptr,
    s_ptr,
    z_ptr,
    g_ptr,
    bias_ptr,
    y_ptr,
    M,
    N,
    K,
    group_size,
    k_per_split,
    stride_x,
    stride_q,
    stride_s,
    stride_y,
    HAS_BIAS: tl.constexpr,
    HAS_G_IDX: tl.constexpr,
    GROUP_TILED: tl.constexpr,
    SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    HALF_DOT: tl.constexpr,
):
    part = tl.program_id(1)
    rows, cols, row_ok, col_ok, x_rows = output_tile(x_ptr, stride_x, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    k_lo = part * k_per_split
    k_hi = tl.minimum(K, k_lo + k_per_split)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        ks, k_ok, x = x_step(x_rows, row_ok, k0, k_hi, BLOCK_K)
        wk_ok = k_ok[:, None] & col_ok[None, :]
        words = tl.load(qw_ptr + (ks // 8)[:, None].to(tl.int64) * stride_q + cols[None, :], mask=wk_ok, other=0)
        q = ((words >> ((ks % 8) * 4)[:, None]) & 0xF).to(tl.float32)
        if GROUP_TILED:  # the whole tile in group k0 // group_size: one row of scales and zeros
            g_off = (k0 // group_size).to(tl.int64) * stride_s
            s = tl.load(s_ptr + g_off + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
            z = tl.load(z_ptr + g_off + cols, mask=col_ok, other=0).to(tl.float32)[None, :]
        else:
            if HAS_G_IDX:
                g = tl.load(g_ptr + ks, mask=k_ok, other=0)
            else:
                g = ks // group_size
            g_offs = g[:, None].to(tl.int64) * stride_s + cols[None, :]
            s = tl.load(s_ptr + g_offs, mask=wk_ok, other=0.0).to(tl.float32)
            z = tl.load(z_ptr + g_offs, mask=wk_ok, other=0).to(tl.float32)
        w = cast((q - z) * s, x_ptr.dtype.element_ty)  # the dequantized weights, as the model dtype
        acc += fp32_dot(x, w, HALF_DOT)
    if SPLIT:  # this part's sums, added in order by _reduce_parts_kernel
        out = y_ptr + part.to(tl.int64) * M * N + rows[:, None].to(tl.int64) * N + cols[None, :]
        tl.store(out, acc, mask=row_ok[:, None] & col_ok[None, :])
    else:
        store_tile(y_ptr, stride_y, acc, bias_ptr, rows, cols, row_ok, col_ok, HAS_BIAS)


@triton.jit(do_not_specialize=["total"])
def _reduce_parts_kernel(
    parts_ptr, bias_ptr, y_ptr, total, N, PARTS: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr
):
    """``y = sum(parts[0..PARTS-1]) (+ bias)``, the parts added in order, then rounded."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < total
    acc = tl.load(parts_ptr + offs, mask=ok, other=0.0)
    for p in tl.static_range(1, PARTS):
        acc += tl.load(parts_ptr + p * total + offs, mask=ok, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs % N, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, cast(acc, y_ptr.dtype.element_ty), mask=ok)


REDUCE_BLOCK = 1024


def int4_linear(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    group_size: int,
    g_idx: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    invariant: bool = False,
    config: Int4Config | None = None,
) -> torch.Tensor:
    """``x @ W.T + bias`` for ``x`` ``(..., K)`` and the 4-bit weight ``W`` ``(N, K)`` in
    :class:`Int4Weight`'s layout, in ``x``'s dtype. ``invariant``: a row's bits do not depend on
    the number of rows (no split). ``config`` overrides :func:`int4_config` (tests)."""
    shape = x.shape
    x2 = as_rows(x)
    m, k = x2.shape
    n = qweight.shape[1]
    if qweight.shape[0] * 8 != k:
        raise ValueError(f"x has {k} features, the 4-bit weight {qweight.shape[0] * 8}")
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return y.view(*shape[:-1], n)
    # one row stride serves scales and zeros (no copies for the layouts as stored)
    qweight, scales, zeros = qweight.contiguous(), scales.contiguous(), zeros.contiguous()
    cfg = config or int4_config(m, n, k, group_size, invariant)
    split = cfg.split_k > 1
    parts = torch.empty((cfg.split_k, m, n), dtype=torch.float32, device=x.device) if split else y
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n), cfg.split_k)
    _int4_matmul_kernel[grid](
        x2,
        qweight,
        scales,
        zeros,
        qweight if g_idx is None else g_idx,
        qweight if bias is None else bias,
        parts,
        m,
        n,
        k,
        group_size,
        cfg.k_per_split,
        x2.stride(0),
        qweight.stride(0),
        scales.stride(0),
        y.stride(0),
        HAS_BIAS=bias is not None,
        HAS_G_IDX=g_idx is not None,
        GROUP_TILED=g_idx is None and group_size % cfg.block_k == 0,
        SPLIT=split,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        GROUP_M=8,
        HALF_DOT=half_dot(x.dtype),
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    if split:
        total = m * n
        _reduce_parts_kernel[(triton.cdiv(total, REDUCE_BLOCK),)](
            parts,
            parts if bias is None else bias,
            y,
            total,
            n,
            PARTS=cfg.split_k,
            HAS_BIAS=bias is not None,
            BLOCK=REDUCE_BLOCK,
        )
    return y.view(*shape[:-1], n)
