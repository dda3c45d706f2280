"""The one-launch paged-attention kernel against dense attention and the reference ops."""

import pytest
import torch

from lmiserve.rolling_batch.ops.reference import ReferenceOps
from lmiserve.rolling_batch.ops.triton_kernels import paged_attention
from tests.unit.engine.test_ops import BS, dense_attention, paged

from ..attention_calls import decode, prefill

LENGTHS = [1, 15, 16, 17, 127, 128, 129]


DEVICE = "cuda:0" if torch.cuda.is_available() else "cpu"
"""Where the kernel runs: compiled on a GPU, else under Triton's interpreter on the CPU."""


def _run(q, k_cache, v_cache, tables, q_lens, lengths, window=0):
    """The kernel over CPU-built inputs, run on the test device; its output back on the CPU."""
    cu = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32)
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    q, k_cache, v_cache, tables, cu, seq_lens = (t.to(DEVICE) for t in (q, k_cache, v_cache, tables, cu, seq_lens))
    out = paged_attention(q, k_cache, v_cache, tables, cu, seq_lens, max(q_lens), q.shape[-1] ** -0.5, window)
    return out.cpu()


@pytest.mark.parametrize("heads,kv_heads", [(8, 2), (32, 8), (4, 4), (9, 3)])
def test_decode_rows_match_dense_attention(heads, kv_heads):
    dim = 32
    k_cache, v_cache, tables, dense = paged(LENGTHS, kv_heads, dim, num_blocks=128)
    q = torch.randn(len(LENGTHS), heads, dim)
    out = _run(q, k_cache, v_cache, tables, [1] * len(LENGTHS), LENGTHS)
    for s, n in enumerate(LENGTHS):
        expected = dense_attention(q[s : s + 1], *dense[s], causal_offset=n - 1)
        assert torch.allclose(out[s : s + 1].double(), expected, atol=1e-5), n


@pytest.mark.parametrize("heads,kv_heads,dim", [(8, 2, 32), (6, 2, 48), (4, 1, 64)])
def test_decodes_chunks_and_cached_prefixes_in_one_launch(heads, kv_heads, dim):
    """Decodes first, then a whole prompt, a chunk continuing a cached prefix, a prompt of 129."""
    lengths = [17, 1, 40, 70, 129]
    q_lens = [1, 1, 40, 23, 129]
    k_cache, v_cache, tables, dense = paged(lengths, kv_heads, dim, num_blocks=64, seed=3)
    q = torch.randn(sum(q_lens), heads, dim)
    out = _run(q, k_cache, v_cache, tables, q_lens, lengths)
    lo = 0
    for s, (n, m) in enumerate(zip(lengths, q_lens)):
        expected = dense_attention(q[lo : lo + m], *dense[s], causal_offset=n - m)
        assert torch.allclose(out[lo : lo + m].double(), expected, atol=1e-5), (n, m)
        lo += m


def test_sliding_window():
    lengths, q_lens = [50, 129], [1, 33]
    k_cache, v_cache, tables, dense = paged(lengths, 2, 32, seed=5)
    q = torch.randn(sum(q_lens), 4, 32)
    out = _run(q, k_cache, v_cache, tables, q_lens, lengths, window=20)
    assert torch.allclose(out[:1].double(), dense_attention(q[:1], *dense[0], 49, window=20), atol=1e-5)
    assert torch.allclose(out[1:].double(), dense_attention(q[1:], *dense[1], 129 - 33, window=20), atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_close_to_the_reference(dtype):
    lengths, q_lens = [1, 33, 100], [1, 33, 10]
    k_cache, v_cache, tables, _ = paged(lengths, 2, 64, seed=7, dtype=dtype)
    q = torch.randn(sum(q_lens), 8, 64).to(dtype)
    cu = torch.tensor([0, 1, 34, 44], dtype=torch.int32)
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    got = _run(q, k_cache, v_cache, tables, [1, 33, 10], lengths)  # scale 64 ** -0.5 = 0.125
    want = prefill(ReferenceOps(), q, k_cache, v_cache, tables, cu, seq_lens, 0.125)
    assert got.dtype == dtype
    assert torch.allclose(got.float(), want.float(), atol=2e-2, rtol=2e-2)


def test_a_tokens_result_does_not_depend_on_the_rest_of_the_step():
    """No split along the keys that varies with the batch: bit-identical alone or batched."""
    lengths = [77, 5, 130]
    k_cache, v_cache, tables, _ = paged(lengths, 2, 32, seed=11, dtype=torch.bfloat16)
    q = torch.randn(3, 8, 32).to(torch.bfloat16)
    together = _run(q, k_cache, v_cache, tables, [1, 1, 1], lengths)
    alone = _run(q[:1], k_cache, v_cache, tables[:1].contiguous(), [1], lengths[:1])
    assert torch.equal(together[:1], alone)


def test_block_size_128():
    lengths = [1, 127, 128, 129, 300]
    g = torch.Generator().manual_seed(1)
    block = 128
    k_cache = torch.randn(16, block, 2, 32, generator=g)
    v_cache = torch.randn(16, block, 2, 32, generator=g)
    tables = torch.tensor([[5, 0, 0], [3, 0, 0], [7, 0, 0], [1, 2, 0], [9, 10, 11]], dtype=torch.int32)
    q = torch.randn(len(lengths), 8, 32)
    out = _run(q, k_cache, v_cache, tables, [1] * len(lengths), lengths)
    want = decode(ReferenceOps(), q, k_cache, v_cache, tables, torch.tensor(lengths, dtype=torch.int32), 32**-0.5)
    assert torch.allclose(out, want, atol=1e-5)
    assert BS == 16  # the shared helper's block size, used above
