"""Paged attention for a whole step in one launch: decodes, prompt chunks and prompts that
continue a cached prefix alike.

Every sequence of the step is a run of query tokens (one for a decode) at the end of its
``seq_len`` tokens, whose keys and values are already in the paged cache. A program takes
``BLOCK_M`` query tokens of one sequence and every query head of one KV head, and walks that
sequence's blocks in position order with an online softmax (in fp32). Nothing is split across
programs along the keys, so a token's result does not depend on what else is in the step.

The CUDA ops launch it with ``skip_decodes``: decodes (one query row) then take the split-KV
kernel (:mod:`.split_kv`), which spreads a long context over many programs, and this one
attends the prompt chunks only.

``max_q_len`` only sizes the launch: a captured step passes its bucket's bound, and programs
past a sequence's own run of query rows return at once, so the launch (grid, tile size,
compile-time constants) depends on the bucket alone (:mod:`...runner.mixed_graphs`).

Deterministic mode launches it for every row, decodes included, with the tile pinned to
:data:`INVARIANT_BLOCK_M` query tokens whatever ``max_q_len`` is. A row then goes through the
same compiled kernel in every step, and meets the same keys in the same blocks (counted from
position 0) in the same order: blocks its tile visits that it may not see (past its own
position, or before its window) leave its maximum, sum and output exactly as they were
(``exp(0) = 1``, probabilities 0). So its bits depend neither on the tokens beside it in the
tile nor on how its prompt was chunked or cached.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .products import fp32_dot, half_dot
from .rounding import cast

VARYING = ("scale", "window", "softcap", "table_stride")
"""Integer and float arguments that change with the step or the model: never specialised on,
so one compiled kernel serves every step (Triton would otherwise compile again when one of
them happens to be 1 or a multiple of 16)."""


@triton.jit
def capped(s, softcap):
    """``tanh(s / softcap) * softcap``, the tanh formed from a sigmoid (which every Triton has)."""
    return softcap * (2.0 * tl.sigmoid(2.0 * s / softcap) - 1.0)


@triton.jit
def scores(q, k, scale, softcap, USE_SOFTCAP: tl.constexpr, HALF_DOT: tl.constexpr):
    """The scaled scores of the rows of ``q`` against the keys ``k``, capped where ``USE_SOFTCAP``."""
    s = fp32_dot(q, tl.trans(k), HALF_DOT) * scale
    if USE_SOFTCAP:
        s = capped(s, softcap)
    return s


@triton.jit
def softmax_step(s, v, m_i, l_i, acc, HALF_DOT: tl.constexpr):
    """A tile of keys taken into the online softmax: their scores ``s`` (``-inf`` where a row may
    not see a key) and values ``v`` into each row's running maximum, sum and unnormalised output;
    the probabilities rounded to the cache's dtype for ``P V``."""
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    pv = fp32_dot(cast(p, v.dtype), v, HALF_DOT)
    return m_new, l_i, acc * alpha[:, None] + pv


@triton.jit
def query_rows(cu_q_lens_ptr, seq):
    """Sequence ``seq``'s run of query rows: its first row and how many there are."""
    q_start = tl.load(cu_q_lens_ptr + seq)
    return q_start, tl.load(cu_q_lens_ptr + seq + 1) - q_start


@triton.jit(do_not_specialize=VARYING)
def _paged_attention_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    block_tables_ptr,
    cu_q_lens_ptr,
    seq_lens_ptr,
    scale,
    window,
    softcap,
    table_stride,
    USE_WINDOW: tl.constexpr,
    USE_SOFTCAP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HALF_DOT: tl.constexpr,
    SKIP_DECODES: tl.constexpr,
):
    seq = tl.program_id(0)
    m_block = tl.program_id(1)
    kv_head = tl.program_id(2)

    q_start, q_len = query_rows(cu_q_lens_ptr, seq)
    if m_block * BLOCK_M >= q_len:
        return
    if SKIP_DECODES:
        if q_len == 1:  # left to the split-KV decode kernel
            return
    seq_len = tl.load(seq_lens_ptr + seq)
    context = seq_len - q_len  # tokens before the first query token

    # rows: BLOCK_M query tokens x GROUP_PAD query heads (those reading this KV head)
    rows = tl.arange(0, BLOCK_M * GROUP_PAD)
    token = m_block * BLOCK_M + rows // GROUP_PAD
    head_in_group = rows % GROUP_PAD
    row_ok = (token < q_len) & (head_in_group < GROUP)
    head = kv_head * GROUP + head_in_group
    q_pos = context + token

    dims = tl.arange(0, DIM_PAD)
    dim_ok = dims < HEAD_DIM
    q_offsets = (q_start + token)[:, None] * (NUM_HEADS * HEAD_DIM) + head[:, None] * HEAD_DIM + dims[None, :]
    q = tl.load(q_ptr + q_offsets, mask=row_ok[:, None] & dim_ok[None, :], other=0.0)

    m_i = tl.full([BLOCK_M * GROUP_PAD], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M * GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M * GROUP_PAD, DIM_PAD], dtype=tl.float32)

    last_q = tl.minimum(context + (m_block + 1) * BLOCK_M, seq_len)  # one past the last key needed
    first_key = 0
    if USE_WINDOW:
        first_key = tl.maximum(context + m_block * BLOCK_M - window + 1, 0)
    keys = tl.arange(0, BLOCK_SIZE)
    kv_row = NUM_KV_HEADS * HEAD_DIM
    for block in range(first_key // BLOCK_SIZE, tl.cdiv(last_q, BLOCK_SIZE)):
        physical = tl.load(block_tables_ptr + seq * table_stride + block).to(tl.int64)
        k_pos = block * BLOCK_SIZE + keys
        kv_offsets = (physical * BLOCK_SIZE + keys)[:, None] * kv_row + kv_head * HEAD_DIM + dims[None, :]
        kv_mask = (k_pos < seq_len)[:, None] & dim_ok[None, :]
        k = tl.load(k_cache_ptr + kv_offsets, mask=kv_mask, other=0.0)
        v = tl.load(v_cache_ptr + kv_offsets, mask=kv_mask, other=0.0)
        s = scores(q, k, scale, softcap, USE_SOFTCAP, HALF_DOT)
        allowed = (k_pos[None, :] <= q_pos[:, None]) & (k_pos[None, :] < seq_len) & row_ok[:, None]
        if USE_WINDOW:
            allowed = allowed & (k_pos[None, :] > q_pos[:, None] - window)
        m_i, l_i, acc = softmax_step(tl.where(allowed, s, float("-inf")), v, m_i, l_i, acc, HALF_DOT)

    l_i = tl.where(l_i > 0, l_i, 1.0)
    out = acc / l_i[:, None]
    tl.store(out_ptr + q_offsets, cast(out, out_ptr.dtype.element_ty), mask=row_ok[:, None] & dim_ok[None, :])


INVARIANT_BLOCK_M = 16
"""Query tokens a program takes in deterministic mode, for prompts and decodes alike (a decode
is a tile with one valid token)."""


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def launch_shape(heads: int, kv_heads: int, max_q_len: int) -> tuple[int, int]:
    """``(GROUP_PAD, BLOCK_M)``: at least 16 rows a program (the matrix units' smallest tile);
    64 rows for prompt chunks, fewer query tokens when many heads share a KV head."""
    group_pad = _pow2(heads // kv_heads)
    rows = 16 if max_q_len == 1 else 64
    return group_pad, max(1, rows // group_pad)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_q_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    max_q_len: int,
    scale: float,
    window: int = 0,
    out: torch.Tensor | None = None,
    skip_decodes: bool = False,
    block_m: int | None = None,
    softcap: float = 0.0,
) -> torch.Tensor:
    """Attention of the query rows ``q`` ``(T, H, D)``: sequence ``s`` owns rows
    ``cu_q_lens[s]:cu_q_lens[s+1]``, the last of its ``seq_lens[s]`` tokens. ``max_q_len`` (a host
    integer, the longest run of query rows) sizes the launch, so no device value is read here.
    With ``skip_decodes``, sequences of one query row are left alone (seen on the device): their
    rows of ``out`` are the split-KV decode kernel's (:mod:`.split_kv`). ``block_m`` fixes the
    query tokens a program takes (deterministic mode); by default :func:`launch_shape` picks it.
    ``softcap`` > 0 caps the scaled scores as ``tanh(s / softcap) * softcap`` (Gemma 2)."""
    tokens, heads, dim = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    num_seqs = block_tables.shape[0]
    if out is None:
        out = torch.empty_like(q)
    group_pad, chosen = launch_shape(heads, kv_heads, max_q_len)
    block_m = block_m or chosen
    grid = (num_seqs, triton.cdiv(max_q_len, block_m), kv_heads)
    _paged_attention_kernel[grid](
        q,
        k_cache,
        v_cache,
        out,
        block_tables,
        cu_q_lens,
        seq_lens,
        scale,
        window,
        softcap,
        block_tables.stride(0),
        USE_WINDOW=window > 0,
        USE_SOFTCAP=softcap > 0,
        HEAD_DIM=dim,
        DIM_PAD=max(16, _pow2(dim)),
        NUM_HEADS=heads,
        NUM_KV_HEADS=kv_heads,
        GROUP=heads // kv_heads,
        GROUP_PAD=group_pad,
        BLOCK_M=block_m,
        BLOCK_SIZE=block_size,
        HALF_DOT=half_dot(q.dtype),
        SKIP_DECODES=skip_decodes,
    )
    return out
