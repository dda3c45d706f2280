"""The ops Gemma adds: capped attention scores (reference and CPU ops, against dense attention
written out here) and the GeGLU activation; Gemma's RMSNorm against transformers' own."""

import pytest
import torch
import torch.nn.functional as F

from lmiserve.rolling_batch.ops.cpu import CpuOps
from lmiserve.rolling_batch.ops.metadata import PagedAttentionInputs
from lmiserve.rolling_batch.ops.reference import ReferenceOps

from .test_ops import paged

OPS = [ReferenceOps(), CpuOps()]


def capped_attention(q, k, v, offset, scale, softcap, window=0):
    """Dense attention of q ``(n, H, D)`` at positions ``offset..`` over k, v ``(L, KVH, D)``."""
    group = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    s = torch.einsum("qhd,khd->hqk", q.double(), k) * scale
    s = torch.tanh(s / softcap) * softcap
    q_pos = torch.arange(offset, offset + q.shape[0]).unsqueeze(1)
    k_pos = torch.arange(k.shape[0]).unsqueeze(0)
    allowed = (k_pos <= q_pos) & ((k_pos > q_pos - window) if window else True)
    s = s.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), v)


@pytest.mark.parametrize("ops", OPS, ids=lambda o: o.name)
@pytest.mark.parametrize("window", [0, 8])
def test_capped_attention_decodes_and_chunks(ops, window):
    """Two decodes, then a whole prompt and a chunk after a cached prefix, in one call."""
    lengths, q_lens = [17, 40, 33, 70], [1, 1, 33, 20]
    k_cache, v_cache, tables, dense = paged(lengths, 2, 16, seed=4)
    q = torch.randn(sum(q_lens), 4, 16) * 4  # scores well past the cap
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    inputs = PagedAttentionInputs.of(tables, cu, torch.tensor(lengths, dtype=torch.int32), num_decodes=2)
    out = ops.attention(q, k_cache, v_cache, inputs, 0.25, window, softcap=2.0)
    uncapped = ops.attention(q, k_cache, v_cache, inputs, 0.25, window)
    assert not torch.allclose(out, uncapped, atol=1e-3)  # the cap changes the result
    for s, (n, m) in enumerate(zip(lengths, q_lens)):
        lo = int(cu[s])
        expected = capped_attention(q[lo : lo + m], *dense[s], n - m, 0.25, 2.0, window)
        assert torch.allclose(out[lo : lo + m].double(), expected, atol=1e-5), (n, m)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_geglu(dtype):
    gate_up = torch.randn(5, 2 * 24).to(dtype)
    gate, up = gate_up.chunk(2, -1)
    for ops in OPS:
        assert torch.equal(ops.geglu(gate_up), F.gelu(gate, approximate="tanh") * up)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemma_norm_matches_transformers(dtype):
    from transformers.models.gemma2.modeling_gemma2 import Gemma2RMSNorm

    from lmiserve.rolling_batch.models.gemma import gemma_norm_weight, gemma_rms_norm

    theirs = Gemma2RMSNorm(32, eps=1e-6)
    with torch.no_grad():
        theirs.weight.copy_(torch.randn(32))
    theirs = theirs.to(dtype)
    x = torch.randn(7, 32).to(dtype)
    for ops in OPS:
        ours = gemma_rms_norm(ops, x, gemma_norm_weight(theirs.weight.detach()), 1e-6)
        assert ours.dtype == dtype
        assert torch.equal(ours, theirs(x).detach())


@pytest.mark.parametrize("dim", [16, 64, 128])
@pytest.mark.parametrize("window", [0, 8])
@pytest.mark.parametrize("tiles", [False, True], ids=["vector", "tiles"])
def test_capped_attention_in_the_cpu_kernels_bf16(dim, window, tiles):
    """bf16 through the C++ kernels (head_dim 64 and 128: the AVX-512 decode and the vdpbf16ps
    prefill, or the prefill on AMX tiles; 16: the portable loops), against the reference."""
    ops = CpuOps()
    if not ops.kernels:
        pytest.skip("no C++ kernels here")
    if tiles and not ops.tiles:
        pytest.skip("AMX tiles: not on this CPU")
    ops.tiles = tiles
    lengths, q_lens = [17, 40, 33, 70], [1, 1, 33, 20]
    k_cache, v_cache, tables, _ = paged(lengths, 2, dim, seed=5, dtype=torch.bfloat16)
    q = (torch.randn(sum(q_lens), 8, dim) * 2).bfloat16()
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    inputs = PagedAttentionInputs.of(tables, cu, torch.tensor(lengths, dtype=torch.int32), num_decodes=2)
    scale = dim**-0.5
    want = ReferenceOps().attention(q, k_cache, v_cache, inputs, scale, window, softcap=1.5)
    got = ops.attention(q, k_cache, v_cache, inputs, scale, window, softcap=1.5)
    plain = ops.attention(q, k_cache, v_cache, inputs, scale, window)
    assert torch.allclose(got.float(), want.float(), atol=2e-2, rtol=2e-2)
    assert not torch.allclose(plain.float(), want.float(), atol=5e-2, rtol=5e-2)
