"""Deterministic mode on the CUDA ops: a linear layer is one launch of the invariant matrix
multiply, and attention is one launch of the paged kernel over every row with a fixed query
tile. A token's attention output is the same bits alone, as a decode, among other sequences,
with its prompt chunked otherwise, and with its prefix read from other (cached) blocks."""

import pytest
import torch

from lmiserve.rolling_batch.ops import create_ops, select_ops
from lmiserve.rolling_batch.ops.batch_invariant import BatchInvariantOps
from lmiserve.rolling_batch.ops.metadata import PagedAttentionInputs
from lmiserve.rolling_batch.ops.reference import ReferenceOps
from tests.unit.engine.test_ops import BS, paged

HEADS, KV_HEADS, DIM = 4, 2, 32
N = 37  # the target's length: two whole blocks and part of a third
OTHERS = [20, 50, 45]  # two decodes and a prompt chunk beside the target
SCALE = DIM**-0.5


@pytest.fixture(scope="module")
def ops():
    return select_ops("cpu", "cuda", deterministic=True)


@pytest.fixture(scope="module")
def cache():
    """bf16 K/V of the target (row 0 of the tables) and the other sequences; the target's
    queries at every position."""
    k_cache, v_cache, tables, _ = paged([N, *OTHERS], KV_HEADS, DIM, num_blocks=24, seed=3, dtype=torch.bfloat16)
    g = torch.Generator().manual_seed(4)
    q = torch.randn(N, HEADS, DIM, generator=g).bfloat16()
    return k_cache, v_cache, tables, q


def _attend(ops, q, k_cache, v_cache, tables, q_lens, seq_lens, window=0, device="cpu"):
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    args = [t.to(device) for t in (q, k_cache, v_cache, tables.contiguous(), cu, lens)]
    paged_inputs = PagedAttentionInputs.of(*args[3:])
    return ops.attention(*args[:3], paged_inputs, SCALE, window).cpu()


def _chunks(ops, cache, size, window=0, device="cpu"):
    """The target's prompt in steps of ``size`` tokens: every row's output, in order."""
    k_cache, v_cache, tables, q = cache
    outs = []
    for start in range(0, N, size):
        end = min(N, start + size)
        outs.append(_attend(ops, q[start:end], k_cache, v_cache, tables[:1], [end - start], [end], window, device))
    return torch.cat(outs)


@pytest.mark.parametrize("window", [0, 20])
def test_a_tokens_attention_is_the_same_bits_in_any_layout(ops, cache, window, kernel_device):
    k_cache, v_cache, tables, q = cache
    whole = _chunks(ops, cache, N, window, kernel_device)
    want = ReferenceOps().attention(q, k_cache, v_cache, PagedAttentionInputs.of(
        tables[:1], torch.tensor([0, N], dtype=torch.int32), torch.tensor([N], dtype=torch.int32)), SCALE, window)  # fmt: skip
    assert torch.allclose(whole.float(), want.float(), atol=2e-2, rtol=2e-2)

    assert torch.equal(_chunks(ops, cache, 3, window, kernel_device), whole)  # chunks of 3
    assert torch.equal(_chunks(ops, cache, 1, window, kernel_device), whole)  # every token a decode

    # among others: two decodes first, the target's last 27 tokens, another prompt chunk of 30
    g = torch.Generator().manual_seed(5)
    beside = [torch.randn(n, HEADS, DIM, generator=g).bfloat16() for n in (1, 1, 30)]
    rows = torch.cat([beside[0], beside[1], q[10:], beside[2]])
    order = tables[[1, 2, 0, 3]]
    out = _attend(ops, rows, k_cache, v_cache, order, [1, 1, N - 10, 30], [OTHERS[0], OTHERS[1], N, OTHERS[2]],
                  window, kernel_device)  # fmt: skip
    assert torch.equal(out[2 : 2 + N - 10], whole[10:])

    # a prefix-cache hit: the first two blocks read from other blocks holding the same keys
    k_hit, v_hit, hit_tables = k_cache.clone(), v_cache.clone(), tables[:1].clone()
    spare = sorted(set(range(k_cache.shape[0])) - set(tables.flatten().tolist()))[:2]
    for i, block in enumerate(spare):
        k_hit[block], v_hit[block] = k_cache[tables[0, i]], v_cache[tables[0, i]]
        hit_tables[0, i] = block
    out = _attend(ops, q[2 * BS :], k_hit, v_hit, hit_tables, [N - 2 * BS], [N], window, kernel_device)
    assert torch.equal(out, whole[2 * BS :])


def test_the_cuda_path_reads_no_host_copies_of_the_lengths(cache, kernel_device):
    """The step's lengths only on the device, its host copies empty: the launch is sized by
    ``max_q_len`` and the shapes alone (so a captured step replays with other lengths)."""
    k_cache, v_cache, tables, q = cache
    ops = BatchInvariantOps(create_ops("cpu", "cuda"))
    dev = [t.to(kernel_device) for t in (q, k_cache, v_cache, tables[:1].contiguous())]
    cu = torch.tensor([0, N], dtype=torch.int32, device=kernel_device)
    lens = torch.tensor([N], dtype=torch.int32, device=kernel_device)
    blind = PagedAttentionInputs(dev[3], cu, lens, max_q_len=N, host_cu_q_lens=[], host_seq_lens=[])
    out = ops.attention(*dev[:3], blind, SCALE).cpu()
    assert torch.equal(out, _chunks(select_ops("cpu", "cuda", deterministic=True), cache, N, 0, kernel_device))


def test_linear_layers_are_one_invariant_launch(monkeypatch, ops, kernel_device):
    """No blocks of rows: one call of the invariant multiply for any number of rows (the LM
    head too), and a row's bits the same alone and among 40."""
    from lmiserve.rolling_batch.ops import triton_kernels

    calls = []
    real = triton_kernels.invariant_linear
    monkeypatch.setattr(triton_kernels, "invariant_linear", lambda *a: calls.append(a[0].shape) or real(*a))
    g = torch.Generator().manual_seed(0)
    w = ops.prepare_linear(torch.randn(80, 48, generator=g).bfloat16().to(kernel_device))
    gate_up = ops.prepare_gate_up(torch.randn(64, 48, generator=g).bfloat16().to(kernel_device))
    x = torch.randn(40, 48, generator=g).bfloat16().to(kernel_device)
    batch = ops.linear(x, w)
    assert torch.equal(ops.linear(x[-1:], w), batch[-1:])
    act = ops.gate_up_swiglu(x, gate_up)
    assert act.shape == (40, 32) and torch.equal(ops.gate_up_swiglu(x[:1], gate_up), act[:1])
    assert calls == [(40, 48), (1, 48), (40, 48), (1, 48)]


def test_one_attention_launch_with_the_fixed_tile_for_decodes_and_prompts(monkeypatch, cache, kernel_device):
    """Whatever the longest run of query rows, the paged kernel takes every row (decodes are
    not skipped, the split-KV kernel is not called) with the same query tile."""
    from lmiserve.rolling_batch.ops.triton_kernels import INVARIANT_BLOCK_M, attention

    launches = []
    real = attention._paged_attention_kernel

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launches.append((grid, kwargs["BLOCK_M"], kwargs["SKIP_DECODES"]))
                return real[grid](*args, **kwargs)

            return launch

    monkeypatch.setattr(attention, "_paged_attention_kernel", Spy())
    ops = select_ops("cpu", "cuda", deterministic=True)
    monkeypatch.setattr(ops.inner.inner.kernels, "split_kv_decode", None)  # never called
    k_cache, v_cache, tables, q = cache
    _attend(ops, q[:2], k_cache, v_cache, tables[:2], [1, 1], [N, OTHERS[0]], device=kernel_device)
    _attend(ops, q, k_cache, v_cache, tables[:1], [N], [N], device=kernel_device)
    assert launches == [((2, 1, KV_HEADS), INVARIANT_BLOCK_M, False), ((1, 3, KV_HEADS), INVARIANT_BLOCK_M, False)]
