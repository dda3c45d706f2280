"""Capped attention scores (Gemma 2) in the Triton kernels, against the reference ops."""

import torch

from lmiserve.rolling_batch.ops.metadata import PagedAttentionInputs
from lmiserve.rolling_batch.ops.reference import ReferenceOps
from lmiserve.rolling_batch.ops.triton_kernels import paged_attention, split_kv_decode
from tests.unit.engine.test_ops import paged


def test_capped_scores_in_both_kernels(kernel_device):
    """Decodes (split-KV, chunks of 16 keys) and prompt chunks (the one-launch kernel), with and
    without a window, against the reference; the cap changes the result."""
    lengths, q_lens = [17, 40, 33, 70], [1, 1, 33, 20]
    k_cache, v_cache, tables, _ = paged(lengths, 2, 16, seed=4)
    q = torch.randn(sum(q_lens), 4, 16) * 4
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    inputs = PagedAttentionInputs.of(tables, cu, seq_lens, num_decodes=2)
    args = [t.to(kernel_device) for t in (q, k_cache, v_cache, tables, cu, seq_lens)]
    for window in (0, 8):
        want = ReferenceOps().attention(q, k_cache, v_cache, inputs, 0.25, window, softcap=2.0)
        out = torch.zeros_like(args[0])
        split_kv_decode(*args, 0.25, window, out, chunk=16, softcap=2.0)
        paged_attention(*args, max(q_lens), 0.25, window, out, skip_decodes=True, softcap=2.0)
        out = out.cpu()
        assert torch.allclose(out, want, atol=1e-5), window
        plain = paged_attention(*args, max(q_lens), 0.25, window).cpu()
        assert not torch.allclose(plain, want, atol=1e-3)
