"""Device ops against straightforward dense attention."""

import math

import pytest
import torch

from lmiserve.rolling_batch.ops.cpu import CpuOps
from lmiserve.rolling_batch.ops.reference import ReferenceOps

from .attention_calls import decode, prefill

BS = 16


def dense_attention(q, k, v, causal_offset, window=0):
    """q (n, H, D), k/v (L, KVH, D): plain softmax attention, query i at position offset + i."""
    n, heads, dim = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    out = torch.zeros(n, heads, dim, dtype=torch.float64)
    for h in range(heads):
        kh, vh = k[:, h // group].double(), v[:, h // group].double()
        for i in range(n):
            pos = causal_offset + i
            lo = max(0, pos - window + 1) if window else 0
            s = (kh[lo : pos + 1] @ q[i, h].double()) / math.sqrt(dim)
            out[i, h] = torch.softmax(s, 0) @ vh[lo : pos + 1]
    return out


def paged(lengths, kv_heads, dim, num_blocks=64, seed=0, dtype=torch.float32):
    """Random K/V for sequences of ``lengths``, scattered over shuffled blocks."""
    g = torch.Generator().manual_seed(seed)
    k_cache = torch.randn(num_blocks, BS, kv_heads, dim, generator=g).to(dtype)
    v_cache = torch.randn(num_blocks, BS, kv_heads, dim, generator=g).to(dtype)
    order = torch.randperm(num_blocks, generator=g).tolist()
    max_blocks = max(-(-n // BS) for n in lengths)
    tables = torch.zeros(len(lengths), max_blocks, dtype=torch.int32)
    dense = []
    for s, n in enumerate(lengths):
        blocks = [order.pop() for _ in range(-(-n // BS))]
        tables[s, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
        slots = torch.tensor([blocks[p // BS] * BS + p % BS for p in range(n)])
        dense.append((k_cache.view(-1, kv_heads, dim)[slots], v_cache.view(-1, kv_heads, dim)[slots]))
    return k_cache, v_cache, tables, dense


OPS = [ReferenceOps(), CpuOps()]
LENGTHS = [1, 15, 16, 17, 127, 128, 129]


@pytest.mark.parametrize("ops", OPS, ids=lambda o: o.name)
@pytest.mark.parametrize("heads,kv_heads", [(8, 2), (32, 8), (4, 4)])
def test_decode_attention_matches_dense(ops, heads, kv_heads):
    dim = 32
    k_cache, v_cache, tables, dense = paged(LENGTHS, kv_heads, dim, num_blocks=128)
    q = torch.randn(len(LENGTHS), heads, dim)
    out = decode(ops, q, k_cache, v_cache, tables, torch.tensor(LENGTHS, dtype=torch.int32), dim**-0.5)
    for s, n in enumerate(LENGTHS):
        expected = dense_attention(q[s : s + 1], *dense[s], causal_offset=n - 1)
        assert torch.allclose(out[s : s + 1].double(), expected, atol=1e-5), (ops.name, n)


@pytest.mark.parametrize("ops", OPS, ids=lambda o: o.name)
def test_decode_attention_sliding_window(ops):
    dim, window = 16, 20
    lengths = [5, 33, 70]
    k_cache, v_cache, tables, dense = paged(lengths, 2, dim)
    q = torch.randn(3, 4, dim)
    out = decode(ops, q, k_cache, v_cache, tables, torch.tensor(lengths, dtype=torch.int32), dim**-0.5, window)
    for s, n in enumerate(lengths):
        expected = dense_attention(q[s : s + 1], *dense[s], causal_offset=n - 1, window=window)
        assert torch.allclose(out[s : s + 1].double(), expected, atol=1e-5)


@pytest.mark.parametrize("ops", OPS, ids=lambda o: o.name)
def test_chunked_prefill_over_a_cached_prefix(ops):
    """Each sequence's new chunk attends to its cached prefix and causally to itself."""
    dim, heads, kv_heads = 32, 8, 2
    totals = [17, 129, 40, 16]
    chunks = [17, 1, 25, 16]  # whole prompt, one token, a chunk after a prefix, exactly one block
    k_cache, v_cache, tables, dense = paged(totals, kv_heads, dim, num_blocks=64)
    cu = torch.tensor([0, *torch.tensor(chunks).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(sum(chunks), heads, dim)
    out = prefill(ops, q, k_cache, v_cache, tables, cu, torch.tensor(totals, dtype=torch.int32), dim**-0.5)
    for s, (total, n) in enumerate(zip(totals, chunks)):
        lo = int(cu[s])
        expected = dense_attention(q[lo : lo + n], *dense[s], causal_offset=total - n)
        assert torch.allclose(out[lo : lo + n].double(), expected, atol=1e-5), (ops.name, total, n)


@pytest.mark.parametrize(
    "heads,kv_heads,dim,window",
    [(9, 3, 64, 0), (8, 2, 64, 20), (32, 8, 128, 0), (4, 4, 64, 0), (12, 2, 64, 0), (6, 3, 32, 0), (16, 1, 128, 50)],
)
def test_cpu_kernel_bf16_close_to_reference(heads, kv_heads, dim, window):
    k_cache, v_cache, tables, _ = paged(LENGTHS, kv_heads, dim, num_blocks=128, dtype=torch.bfloat16)
    q = torch.randn(len(LENGTHS), heads, dim).bfloat16()
    lens = torch.tensor(LENGTHS, dtype=torch.int32)
    ref = decode(ReferenceOps(), q, k_cache, v_cache, tables, lens, dim**-0.5, window)
    fast = decode(CpuOps(), q, k_cache, v_cache, tables, lens, dim**-0.5, window)
    assert torch.allclose(ref.float(), fast.float(), atol=2e-2)


def paged_blocks(lengths, kv_heads, dim, block_size, seed=0):
    """bf16 K/V in blocks of ``block_size`` tokens, shuffled; the dense K/V of each sequence."""
    g = torch.Generator().manual_seed(seed)
    blocks_of = [-(-n // block_size) for n in lengths]
    num_blocks = sum(blocks_of) + 4
    k_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=g).bfloat16()
    v_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=g).bfloat16()
    order = torch.randperm(num_blocks, generator=g).tolist()
    tables = torch.zeros(len(lengths), max(blocks_of), dtype=torch.int32)
    dense = []
    for s, n in enumerate(lengths):
        blocks = [order.pop() for _ in range(blocks_of[s])]
        tables[s, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
        slots = torch.tensor([blocks[p // block_size] * block_size + p % block_size for p in range(n)])
        dense.append((k_cache.view(-1, kv_heads, dim)[slots], v_cache.view(-1, kv_heads, dim)[slots]))
    return k_cache, v_cache, tables, dense


@pytest.mark.parametrize(
    "lengths,heads,kv_heads,dim,block_size,window",
    [
        ([190, 254, 1, 17, 33, 300, 64, 129, 5], 9, 3, 64, 16, 0),  # SmolLM2: whole sequences per task
        ([200], 9, 3, 64, 16, 0),  # one sequence: a task per KV head
        ([31, 250, 47], 8, 2, 128, 16, 0),
        ([40, 97, 16, 15, 200], 12, 4, 64, 32, 0),  # blocks of 32: two stretches of 16 per block
        ([100, 7, 260, 33], 8, 2, 64, 16, 40),  # a window starting inside a stretch
        ([18, 1], 4, 4, 64, 16, 0),
    ],
)
def test_cpu_decode_kernel_bf16_matches_dense(lengths, heads, kv_heads, dim, block_size, window):
    """The AVX-512 decode kernel (two passes over each sequence, the next rows requested while a
    stretch is used) against dense attention in fp64 over the same bf16 keys and values."""
    k_cache, v_cache, tables, dense = paged_blocks(lengths, kv_heads, dim, block_size)
    q = torch.randn(len(lengths), heads, dim, generator=torch.Generator().manual_seed(1)).bfloat16()
    lens = torch.tensor(lengths, dtype=torch.int32)
    out = decode(CpuOps(), q, k_cache, v_cache, tables, lens, dim**-0.5, window)
    for s, n in enumerate(lengths):
        expected = dense_attention(q[s : s + 1], *dense[s], causal_offset=n - 1, window=window)
        # the kernel's sums are fp32; its output is rounded to bf16 (8 bits of mantissa)
        assert torch.allclose(out[s : s + 1].double(), expected, atol=4e-3, rtol=8e-3), (s, n)


@pytest.fixture(params=[False, True], ids=["vector", "tiles"])
def tiles(request):
    """Prompt attention in bf16 on the vector code, or on AMX tiles where the CPU has them."""
    if request.param and not CpuOps().tiles:
        pytest.skip("AMX tiles: not on this CPU")
    return request.param


def prefill_ops(tiles):
    ops = CpuOps()
    ops.tiles = tiles
    return ops


@pytest.mark.parametrize(
    "totals,chunks,heads,kv_heads,dim,block_size,window",
    [
        ([190, 40, 129, 33], [190, 1, 25, 17], 9, 3, 64, 16, 0),  # SmolLM2: 3 queries a row, 4 at a time
        ([70, 300], [70, 37], 7, 1, 64, 32, 0),  # 7 heads a KV head (remainders of 3), blocks of 32
        ([100, 64], [100, 64], 8, 2, 128, 16, 30),  # head_dim 128, a window inside a stretch
        ([20, 5], [3, 5], 2, 2, 64, 16, 0),  # one query head per KV head
        ([300, 77], [250, 77], 4, 1, 64, 16, 100),  # tiles: a window across stretches of 32 keys
    ],
)
def test_cpu_prefill_kernel_bf16_matches_dense(totals, chunks, heads, kv_heads, dim, block_size, window, tiles):
    """The bf16 prefill kernels (keys transposed into pairs of dimensions; scores by vdpbf16ps,
    or on AMX tiles with the probabilities in two bf16 terms; an online softmax per query)
    against dense attention in fp64 over the same bf16 values."""
    k_cache, v_cache, tables, dense = paged_blocks(totals, kv_heads, dim, block_size)
    cu = torch.tensor([0, *torch.tensor(chunks).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(sum(chunks), heads, dim, generator=torch.Generator().manual_seed(2)).bfloat16()
    lens = torch.tensor(totals, dtype=torch.int32)
    out = prefill(prefill_ops(tiles), q, k_cache, v_cache, tables, cu, lens, dim**-0.5, window)
    for s, (total, n) in enumerate(zip(totals, chunks)):
        lo = int(cu[s])
        expected = dense_attention(q[lo : lo + n], *dense[s], causal_offset=total - n, window=window)
        assert torch.allclose(out[lo : lo + n].double(), expected, atol=4e-3, rtol=8e-3), (total, n)


@pytest.mark.parametrize(
    "heads,kv_heads,dim,window,dtype",
    [
        (9, 3, 64, 0, torch.bfloat16),  # SmolLM2's shapes
        (8, 2, 64, 20, torch.bfloat16),
        (32, 8, 128, 0, torch.bfloat16),
        (4, 4, 64, 0, torch.float16),
        (6, 3, 32, 0, torch.bfloat16),  # a head size without the vector path
        (16, 1, 128, 50, torch.bfloat16),
    ],
)
def test_cpu_prefill_kernel_half_precision_matches_dense(heads, kv_heads, dim, window, dtype):
    """Prompt chunks in bf16/fp16 go through the C++ kernel: each row sees its cached prefix and
    the chunk's rows before it (tiles of 16 rows, rows past a multiple of four queries)."""
    totals = [190, 40, 129, 16, 33, 1]
    chunks = [190, 1, 25, 16, 17, 1]  # whole prompts, one token, chunks after a prefix
    k_cache, v_cache, tables, dense = paged(totals, kv_heads, dim, num_blocks=48, dtype=dtype)
    cu = torch.tensor([0, *torch.tensor(chunks).cumsum(0).tolist()], dtype=torch.int32)
    # q as a view into a wider projection, as the model hands it over (rows not contiguous)
    fused = torch.randn(sum(chunks), heads + 2 * kv_heads, dim).to(dtype)
    q = fused[:, :heads]
    ops = CpuOps()
    assert ops.kernels
    out = prefill(ops, q, k_cache, v_cache, tables, cu, torch.tensor(totals, dtype=torch.int32), dim**-0.5, window)
    assert out.dtype == dtype and out.shape == q.shape
    for s, (total, n) in enumerate(zip(totals, chunks)):
        lo = int(cu[s])
        expected = dense_attention(q[lo : lo + n], *dense[s], causal_offset=total - n, window=window)
        assert torch.allclose(out[lo : lo + n].double(), expected, atol=2e-2), (total, n)
