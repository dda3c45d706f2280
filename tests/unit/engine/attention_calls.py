"""The ops' one attention call, made for decodes alone or prompt chunks alone."""

import torch

from lmiserve.rolling_batch.ops.metadata import PagedAttentionInputs


def decode(ops, q, k_cache, v_cache, block_tables, seq_lens, scale, window=0):
    """One query row per sequence: q ``(B, H, D)``; ``seq_lens`` count that token."""
    cu = torch.arange(q.shape[0] + 1, dtype=torch.int32, device=q.device)
    paged = PagedAttentionInputs.of(block_tables, cu, seq_lens, num_decodes=q.shape[0])
    return ops.attention(q, k_cache, v_cache, paged, scale, window)


def prefill(ops, q, k_cache, v_cache, block_tables, cu_q_lens, seq_lens, scale, window=0):
    """Prompt chunks: sequence ``s`` at rows ``cu_q_lens[s]:cu_q_lens[s+1]`` of q."""
    paged = PagedAttentionInputs.of(block_tables, cu_q_lens, seq_lens, num_decodes=0)
    return ops.attention(q, k_cache, v_cache, paged, scale, window)
