"""Pictures whose tokens attend to each other both ways (Gemma 3): after a layer's causal attention,
the rows of a picture's tokens are attended again with the picture's later tokens unmasked (the
step holds the picture's last token, so every key is in the cache). Keys past the layer's sliding
window stay masked, as transformers composes the two masks."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ImageBlock:
    rows: tuple[int, int]
    """The step's rows of the picture's tokens (a run)."""
    first: int
    """The position of the first of those rows."""
    span: tuple[int, int]
    """The positions of all the picture's tokens."""
    block_table: torch.Tensor
    """The sequence's KV blocks."""


def attend_image_blocks(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    attn: torch.Tensor,
    blocks: list[ImageBlock],
    scale: float,
    window: int,
    softcap: float,
) -> torch.Tensor:
    """``attn`` ``(T, H, D)`` with each block's rows attended again, bidirectionally within the picture."""
    block_size, kv_heads, dim = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    out = attn.clone()
    for b in blocks:
        lo, hi = b.rows
        rows = q[lo:hi].float()
        heads = rows.shape[1]
        keys_end = b.span[1]
        pos = torch.arange(keys_end, device=q.device)
        slots = b.block_table.long()[pos // block_size] * block_size + pos % block_size
        k = k_cache.view(-1, kv_heads, dim)[slots].float().repeat_interleave(heads // kv_heads, dim=1)
        v = v_cache.view(-1, kv_heads, dim)[slots].float().repeat_interleave(heads // kv_heads, dim=1)
        scores = torch.einsum("qhd,khd->hqk", rows, k) * scale
        if softcap > 0:
            scores = torch.tanh(scores / softcap) * softcap
        q_pos = torch.arange(b.first, b.first + hi - lo, device=q.device).unsqueeze(1)
        k_pos = pos.unsqueeze(0)
        allowed = (k_pos <= q_pos) | ((k_pos >= b.span[0]) & (k_pos < b.span[1]))
        if window > 0:
            allowed &= k_pos > q_pos - window
        probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
        out[lo:hi] = torch.einsum("hqk,khd->qhd", probs, v).to(attn.dtype).view(hi - lo, heads, -1)
    return out
