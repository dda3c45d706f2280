"""The split-KV decode kernel against dense attention and the reference ops, its independence
from the rest of the batch, and the CUDA ops' dispatch of decodes and prompt chunks to it and
to the one-launch kernel. Chunks of 32 keys keep the interpreted contexts short."""

import pytest
import torch

from lmiserve.rolling_batch.ops.cuda import CudaOps
from lmiserve.rolling_batch.ops.metadata import PagedAttentionInputs
from lmiserve.rolling_batch.ops.reference import ReferenceOps
from lmiserve.rolling_batch.ops.triton_kernels import paged_attention, split_kv_decode
from lmiserve.rolling_batch.ops.triton_kernels.split_kv import CHUNK
from tests.unit.engine.test_ops import dense_attention, paged

from ..attention_calls import decode

SMALL = 32
LENGTHS = [1, 31, 32, 33, 64, 100, 130]  # one, two and several chunks of SMALL keys


def _cu(q_lens):
    return torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32)


def _split(device, q, k_cache, v_cache, tables, lengths, window=0, chunk=SMALL, q_lens=None):
    """The kernel over CPU-built inputs, run on ``device``; its output back on the CPU."""
    cu = _cu(q_lens or [1] * len(lengths))
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    args = [t.to(device) for t in (q, k_cache, v_cache, tables, cu, seq_lens)]
    out = torch.zeros_like(args[0])
    return split_kv_decode(*args, q.shape[-1] ** -0.5, window, out, chunk=chunk).cpu()


@pytest.mark.parametrize("heads,kv_heads", [(8, 2), (4, 4), (9, 3)])
def test_decodes_of_one_two_and_many_chunks_match_dense_attention(heads, kv_heads, kernel_device):
    k_cache, v_cache, tables, dense = paged(LENGTHS, kv_heads, 32, num_blocks=64)
    q = torch.randn(len(LENGTHS), heads, 32)
    out = _split(kernel_device, q, k_cache, v_cache, tables, LENGTHS)
    for s, n in enumerate(LENGTHS):
        expected = dense_attention(q[s : s + 1], *dense[s], causal_offset=n - 1)
        assert torch.allclose(out[s : s + 1].double(), expected, atol=1e-5), n


@pytest.mark.parametrize("window", [20, 40])
def test_sliding_window_skips_the_chunks_before_it(window, kernel_device):
    """Windows that start inside a chunk, on a chunk's first key, and cover a whole sequence."""
    lengths = [10, 50, 72, 96, 129, 130]
    k_cache, v_cache, tables, dense = paged(lengths, 2, 32, seed=5)
    q = torch.randn(len(lengths), 4, 32)
    out = _split(kernel_device, q, k_cache, v_cache, tables, lengths, window=window)
    for s, n in enumerate(lengths):
        expected = dense_attention(q[s : s + 1], *dense[s], n - 1, window=window)
        assert torch.allclose(out[s : s + 1].double(), expected, atol=1e-5), n


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_close_to_the_reference(dtype, kernel_device):
    lengths = [1, 33, 100]
    k_cache, v_cache, tables, _ = paged(lengths, 2, 64, seed=7, dtype=dtype)
    q = torch.randn(len(lengths), 8, 64).to(dtype)
    got = _split(kernel_device, q, k_cache, v_cache, tables, lengths)
    want = decode(ReferenceOps(), q, k_cache, v_cache, tables, torch.tensor(lengths, dtype=torch.int32), 0.125)
    assert got.dtype == dtype
    assert torch.allclose(got.float(), want.float(), atol=2e-2, rtol=2e-2)


def test_rows_that_are_not_decodes_are_left_alone(kernel_device):
    lengths, q_lens = [40, 70, 65], [1, 5, 1]
    k_cache, v_cache, tables, dense = paged(lengths, 2, 32, seed=2)
    q = torch.randn(sum(q_lens), 4, 32)
    out = _split(kernel_device, q, k_cache, v_cache, tables, lengths, q_lens=q_lens)
    assert torch.equal(out[1:6], torch.zeros(5, 4, 32))
    assert torch.allclose(out[:1].double(), dense_attention(q[:1], *dense[0], 39), atol=1e-5)
    assert torch.allclose(out[6:].double(), dense_attention(q[6:], *dense[2], 64), atol=1e-5)


@pytest.mark.parametrize("window", [0, 24])
def test_a_decodes_bits_do_not_depend_on_the_rest_of_the_batch(window, kernel_device):
    """Alone, with a table just wide enough, or beside shorter and longer sequences under a
    wider table (more chunks in the launch): the same bits."""
    lengths = [77, 5, 130, 33]
    k_cache, v_cache, tables, _ = paged(lengths, 2, 32, seed=11, dtype=torch.bfloat16)
    q = torch.randn(len(lengths), 8, 32).to(torch.bfloat16)
    together = _split(kernel_device, q, k_cache, v_cache, tables, lengths, window)
    for s, n in enumerate(lengths):
        narrow = tables[s : s + 1, : -(-n // 16)].contiguous()
        alone = _split(kernel_device, q[s : s + 1], k_cache, v_cache, narrow, [n], window)
        assert torch.equal(together[s : s + 1], alone), n


def test_default_chunk_with_blocks_of_128(kernel_device):
    lengths = [1, 127, 300, 520]
    g = torch.Generator().manual_seed(1)
    k_cache = torch.randn(16, 128, 2, 32, generator=g)
    v_cache = torch.randn(16, 128, 2, 32, generator=g)
    tables = torch.tensor([[5, 0, 0, 0, 0], [3, 0, 0, 0, 0], [1, 2, 4, 0, 0], [9, 10, 11, 12, 13]], dtype=torch.int32)
    q = torch.randn(len(lengths), 8, 32)
    out = _split(kernel_device, q, k_cache, v_cache, tables, lengths, chunk=CHUNK)
    want = decode(ReferenceOps(), q, k_cache, v_cache, tables, torch.tensor(lengths, dtype=torch.int32), 32**-0.5)
    assert torch.allclose(out, want, atol=1e-5)


def test_the_one_launch_kernel_can_leave_decodes_alone(kernel_device):
    lengths, q_lens = [40, 70], [1, 9]
    k_cache, v_cache, tables, dense = paged(lengths, 2, 32, seed=4)
    q = torch.randn(sum(q_lens), 4, 32)
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    args = [t.to(kernel_device) for t in (q, k_cache, v_cache, tables, _cu(q_lens), seq_lens)]
    out = torch.zeros_like(args[0])
    paged_attention(*args, 9, 32**-0.5, 0, out, skip_decodes=True)
    out = out.cpu()
    assert torch.equal(out[:1], torch.zeros(1, 4, 32))
    assert torch.allclose(out[1:].double(), dense_attention(q[1:], *dense[1], 70 - 9), atol=1e-5)


def _ops_attention(device, ops, q, k_cache, v_cache, tables, lengths, q_lens, window=0):
    cu, seq_lens = _cu(q_lens), torch.tensor(lengths, dtype=torch.int32)
    nd = next((i for i, m in enumerate(q_lens) if m != 1), len(q_lens))
    q, k_cache, v_cache, tables, cu, seq_lens = (t.to(device) for t in (q, k_cache, v_cache, tables, cu, seq_lens))
    meta = PagedAttentionInputs(tables, cu, seq_lens, max(q_lens), cu.tolist(), lengths, nd)
    return ops.attention(q, k_cache, v_cache, meta, q.shape[-1] ** -0.5, window).cpu()


@pytest.mark.parametrize("window", [0, 100])
def test_cuda_ops_mixed_step_matches_the_reference(window, kernel_device):
    """Decodes of one and three default chunks beside a whole prompt and a chunk that continues
    a cached prefix; each decode gives the same bits as in a step of its own."""
    lengths, q_lens = [300, 600, 20, 17, 90], [1, 1, 1, 17, 30]
    k_cache, v_cache, tables, _ = paged(lengths, 2, 32, num_blocks=80, seed=9, dtype=torch.bfloat16)
    q = torch.randn(sum(q_lens), 8, 32).to(torch.bfloat16)
    got = _ops_attention(kernel_device, CudaOps(), q, k_cache, v_cache, tables, lengths, q_lens, window)
    want = _ops_attention("cpu", ReferenceOps(), q, k_cache, v_cache, tables, lengths, q_lens, window)
    assert torch.allclose(got.float(), want.float(), atol=2e-2, rtol=2e-2)
    decodes = _ops_attention(
        kernel_device, CudaOps(), q[:3], k_cache, v_cache, tables[:3], lengths[:3], [1] * 3, window
    )
    assert torch.equal(got[:3], decodes)
