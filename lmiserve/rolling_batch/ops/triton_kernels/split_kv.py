"""Decode attention split along the keys at fixed positions (split-KV, "flash decoding").

A decode is one query token over all of its sequence's keys. Walked by one program per
(sequence, KV head), a step of few sequences keeps a GPU mostly idle while each program reads
a long context serially. Here a sequence's keys are cut into chunks of exactly :data:`CHUNK`
keys, counted from position 0:

1. one program per (sequence, chunk, KV head) attends every query head of its KV head to the
   keys of its chunk with an online softmax in fp32, and leaves the chunk's running maximum,
   sum and unnormalised output in a scratch buffer;
2. one program per (sequence, KV head) folds the chunks of each head in chunk order and writes
   the output in the output dtype.

A sequence whose visible keys fit in one chunk is finished by its single program, which writes
the output itself (the fold of one chunk would give the same bits). The chunk size is a
constant, not a function of the batch, and the fold runs in a fixed order, so a token's result
depends on its own sequence only. Chunks wholly before a sliding window do nothing and are not
folded.

Both launches are sized from host integers alone (the sequences in the launch, the most chunks
the caller's stated context can hold, the KV heads); a program whose sequence is not a decode
(``q_len != 1``, read on the device) or whose chunk lies past its sequence exits at once. So the
pair can be captured in a CUDA graph and replayed with other lengths. The price is scratch
sized for the stated context: ``sequences x cdiv(max_context, CHUNK) x heads x (head_dim + 2)``
fp32 values (for 256 sequences of up to 8,192 tokens, 32 heads of 128: 130 MiB), held once per
device for eager steps and once in the graphs' memory pool.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .attention import query_rows, scores, softmax_step
from .products import half_dot
from .rounding import cast

CHUNK = 256
"""Keys per chunk: a multiple of every block size in use (16 on GPUs, 128 on NPUs)."""

_EMPTY = tl.constexpr(-1.0e30)
"""The running maximum before any key (finite, so that ``exp(_EMPTY - m)`` is 0, not NaN)."""


@triton.jit
def decode_keys(cu_q_lens_ptr, seq_lens_ptr, seq, window, USE_WINDOW: tl.constexpr, CHUNK_KEYS: tl.constexpr):
    """Sequence ``seq``'s first query row, its number of query rows (1 for a decode), its length,
    the first key its last token sees (past a sliding window) and that key's chunk."""
    q_start, q_len = query_rows(cu_q_lens_ptr, seq)
    seq_len = tl.load(seq_lens_ptr + seq)
    first_key = 0
    if USE_WINDOW:
        first_key = tl.maximum(seq_len - window, 0)
    return q_start, q_len, seq_len, first_key, first_key // CHUNK_KEYS


@triton.jit(do_not_specialize=["window", "softcap", "table_stride", "max_chunks"])
def _split_kv_partial_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    part_acc_ptr,
    part_max_ptr,
    part_sum_ptr,
    block_tables_ptr,
    cu_q_lens_ptr,
    seq_lens_ptr,
    scale,
    window,
    softcap,
    table_stride,
    max_chunks,
    USE_SOFTCAP: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    CHUNK_KEYS: tl.constexpr,
    TILE: tl.constexpr,
    HALF_DOT: tl.constexpr,
):
    seq = tl.program_id(0)
    chunk = tl.program_id(1)
    kv_head = tl.program_id(2)

    q_start, q_len, seq_len, first_key, first_chunk = decode_keys(
        cu_q_lens_ptr, seq_lens_ptr, seq, window, USE_WINDOW, CHUNK_KEYS
    )
    num_chunks = tl.cdiv(seq_len, CHUNK_KEYS) - first_chunk  # chunks holding keys it sees
    lo = chunk * CHUNK_KEYS
    if (q_len != 1) | (chunk < first_chunk) | (lo >= seq_len):
        return
    hi = tl.minimum(lo + CHUNK_KEYS, seq_len)

    # rows: the query heads reading this KV head (padded to the matrix units' 16 rows)
    rows = tl.arange(0, ROWS)
    row_ok = rows < GROUP
    head = kv_head * GROUP + rows
    dims = tl.arange(0, DIM_PAD)
    dim_ok = dims < HEAD_DIM
    row_mask = row_ok[:, None] & dim_ok[None, :]
    q_offsets = q_start * (NUM_HEADS * HEAD_DIM) + head[:, None] * HEAD_DIM + dims[None, :]
    q = tl.load(q_ptr + q_offsets, mask=row_mask, other=0.0)

    m_i = tl.full([ROWS], _EMPTY, dtype=tl.float32)
    l_i = tl.zeros([ROWS], dtype=tl.float32)
    acc = tl.zeros([ROWS, DIM_PAD], dtype=tl.float32)

    keys = tl.arange(0, TILE)
    kv_row = NUM_KV_HEADS * HEAD_DIM
    for tile in range(tl.maximum(lo, first_key) // TILE, tl.cdiv(hi, TILE)):
        k_pos = tile * TILE + keys
        key_ok = (k_pos >= first_key) & (k_pos < hi)
        physical = tl.load(block_tables_ptr + seq * table_stride + k_pos // BLOCK_SIZE, mask=key_ok, other=0)
        slot = physical.to(tl.int64) * BLOCK_SIZE + k_pos % BLOCK_SIZE
        kv_offsets = slot[:, None] * kv_row + kv_head * HEAD_DIM + dims[None, :]
        kv_mask = key_ok[:, None] & dim_ok[None, :]
        k = tl.load(k_cache_ptr + kv_offsets, mask=kv_mask, other=0.0)
        v = tl.load(v_cache_ptr + kv_offsets, mask=kv_mask, other=0.0)
        s = scores(q, k, scale, softcap, USE_SOFTCAP, HALF_DOT)
        s = tl.where(row_ok[:, None] & key_ok[None, :], s, float("-inf"))
        m_i, l_i, acc = softmax_step(s, v, m_i, l_i, acc, HALF_DOT)

    if num_chunks == 1:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(out_ptr + q_offsets, cast(out, out_ptr.dtype.element_ty), mask=row_mask)
    else:
        part = (seq.to(tl.int64) * max_chunks + chunk) * NUM_HEADS + head
        tl.store(part_max_ptr + part, m_i, mask=row_ok)
        tl.store(part_sum_ptr + part, l_i, mask=row_ok)
        tl.store(part_acc_ptr + part[:, None] * HEAD_DIM + dims[None, :], acc, mask=row_mask)


@triton.jit(do_not_specialize=["window", "max_chunks"])
def _split_kv_combine_kernel(
    out_ptr,
    part_acc_ptr,
    part_max_ptr,
    part_sum_ptr,
    cu_q_lens_ptr,
    seq_lens_ptr,
    window,
    max_chunks,
    USE_WINDOW: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    NUM_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    CHUNK_KEYS: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)

    q_start, q_len, seq_len, _, first_chunk = decode_keys(
        cu_q_lens_ptr, seq_lens_ptr, seq, window, USE_WINDOW, CHUNK_KEYS
    )
    end_chunk = tl.cdiv(seq_len, CHUNK_KEYS)
    if (q_len != 1) | (end_chunk - first_chunk <= 1):  # not a decode, or written by its one chunk
        return

    rows = tl.arange(0, GROUP_PAD)
    row_ok = rows < GROUP
    head = kv_head * GROUP + rows
    dims = tl.arange(0, DIM_PAD)
    row_mask = row_ok[:, None] & (dims < HEAD_DIM)[None, :]

    m_i = tl.full([GROUP_PAD], _EMPTY, dtype=tl.float32)
    l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, DIM_PAD], dtype=tl.float32)
    for chunk in range(first_chunk, end_chunk):
        part = (seq.to(tl.int64) * max_chunks + chunk) * NUM_HEADS + head
        m_c = tl.load(part_max_ptr + part, mask=row_ok, other=_EMPTY)
        l_c = tl.load(part_sum_ptr + part, mask=row_ok, other=0.0)
        acc_c = tl.load(part_acc_ptr + part[:, None] * HEAD_DIM + dims[None, :], mask=row_mask, other=0.0)
        m_new = tl.maximum(m_i, m_c)
        alpha = tl.exp(m_i - m_new)
        beta = tl.exp(m_c - m_new)
        l_i = l_i * alpha + l_c * beta
        acc = acc * alpha[:, None] + acc_c * beta[:, None]
        m_i = m_new

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    out_offsets = q_start * (NUM_HEADS * HEAD_DIM) + head[:, None] * HEAD_DIM + dims[None, :]
    tl.store(out_ptr + out_offsets, cast(out, out_ptr.dtype.element_ty), mask=row_mask)


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


_WORKSPACES: dict[torch.device, torch.Tensor] = {}


def scratch_bytes(num_seqs: int, max_context: int, heads: int, dim: int, chunk: int = CHUNK) -> int:
    """Bytes of :func:`scratch` that a launch over ``num_seqs`` sequences of up to
    ``max_context`` keys takes (what the KV cache must leave free for it)."""
    return 4 * num_seqs * max(1, -(-max_context // chunk)) * heads * (dim + 2)


def scratch(device: torch.device, numel: int) -> torch.Tensor:
    """fp32 scratch of ``numel`` elements. Outside graph capture it is a view of one buffer per
    device, grown when a launch needs more, so eager steps allocate nothing once warm. While a
    CUDA graph is being captured it is allocated in the graph's own memory pool instead: a graph
    must never point at a buffer a later eager step may replace."""
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return torch.empty(numel, dtype=torch.float32, device=device)
    buffer = _WORKSPACES.get(device)
    if buffer is None or buffer.numel() < numel:
        buffer = torch.empty(numel, dtype=torch.float32, device=device)
        _WORKSPACES[device] = buffer
    return buffer[:numel]


def split_kv_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_q_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    window: int = 0,
    out: torch.Tensor | None = None,
    max_context: int | None = None,
    chunk: int = CHUNK,
    softcap: float = 0.0,
) -> torch.Tensor:
    """Attention of every decode row of ``q`` ``(T, H, D)`` (sequence ``s`` owns rows
    ``cu_q_lens[s]:cu_q_lens[s+1]``; a decode owns one); other rows of ``out`` are left as they
    are. ``max_context`` (a host integer, by default the block tables' width in keys) bounds
    every ``seq_lens[s]`` and sizes the launch with the sequences in ``block_tables``; no device
    value is read here. ``chunk`` (keys, a multiple of 16) is :data:`CHUNK` but in tests.
    ``softcap`` > 0 caps the scaled scores as ``tanh(s / softcap) * softcap``."""
    tokens, heads, dim = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    num_seqs = block_tables.shape[0]
    if out is None:
        out = torch.empty_like(q)
    if num_seqs == 0 or tokens == 0:
        return out
    if chunk % 16:
        raise ValueError(f"a split-KV chunk of {chunk} keys is not a multiple of 16")
    if max_context is None:
        max_context = block_tables.shape[1] * block_size
    max_chunks = max(1, triton.cdiv(max_context, chunk))
    parts = num_seqs * max_chunks * heads
    buffer = scratch(q.device, parts * (dim + 2))
    part_acc, part_max, part_sum = buffer[: parts * dim], buffer[parts * dim : -parts], buffer[-parts:]
    group = heads // kv_heads
    shape = dict(USE_WINDOW=window > 0, HEAD_DIM=dim, DIM_PAD=max(16, _pow2(dim)), NUM_HEADS=heads, GROUP=group)
    _split_kv_partial_kernel[(num_seqs, max_chunks, kv_heads)](
        q,
        k_cache,
        v_cache,
        out,
        part_acc,
        part_max,
        part_sum,
        block_tables,
        cu_q_lens,
        seq_lens,
        scale,
        window,
        softcap,
        block_tables.stride(0),
        max_chunks,
        USE_SOFTCAP=softcap > 0,
        NUM_KV_HEADS=kv_heads,
        ROWS=max(16, _pow2(group)),
        BLOCK_SIZE=block_size,
        CHUNK_KEYS=chunk,
        TILE=64 if chunk % 64 == 0 else 16,
        HALF_DOT=half_dot(q.dtype),
        **shape,
    )
    _split_kv_combine_kernel[(num_seqs, kv_heads)](
        out,
        part_acc,
        part_max,
        part_sum,
        cu_q_lens,
        seq_lens,
        window,
        max_chunks,
        GROUP_PAD=_pow2(group),
        CHUNK_KEYS=chunk,
        **shape,
    )
    return out
