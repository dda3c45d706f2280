"""Gemma 2 and Gemma 3 (text): the generic decoder (:mod:`.decoder`) with what Gemma computes
otherwise.

- RMSNorm scales by ``1 + weight``, both in fp32, and only then casts back (Llama casts the
  normalised input back first); the ``1 + weight`` is formed once here, in fp32.
- Four norms a layer: before and after attention, before and after the MLP; the residual is
  added after the "post" norms (the spec's ``norm_placement`` "sandwich").
- Embeddings are multiplied by ``sqrt(hidden)`` rounded to the model's dtype.
- The MLP is GeGLU (gelu with the tanh approximation, :meth:`~..ops.interface.Ops.geglu`).
- Attention scores are scaled by ``query_pre_attn_scalar ** -0.5``; layers alternate between a
  sliding window and global attention (``ModelSpec.layer_windows``).
- Gemma 2 caps attention scores and logits (``tanh(x / c) * c``); Gemma 3 normalises queries and
  keys per head and rotates them with a table per layer type (local and global bases).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ..ops.interface import Ops
from .decoder import DecoderModel


def gemma_norm_weight(weight: torch.Tensor) -> torch.Tensor:
    """``1 + weight`` in fp32: the factor Gemma's RMSNorm multiplies by."""
    return 1.0 + weight.float()


def gemma_rms_norm(ops: Ops, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma's RMSNorm over the last dimension, with ``weight`` from :func:`gemma_norm_weight`:
    normalised and scaled in fp32, then cast to ``x``'s dtype (as transformers computes it).
    That is the ops' RMSNorm of ``x`` in fp32 (so deterministic mode's fixed blocks apply)."""
    return ops.rms_norm(x.float(), weight, eps)[0].to(x.dtype)


class GemmaModel(DecoderModel):
    """Gemma 2 / Gemma 3 text. ``cos``/``sin`` as :func:`.rope.rope_tables` gives them: one
    table (Gemma 2), or a global and a local table stacked (Gemma 3)."""

    GATED_SWIGLU = False

    def __init__(self, *args: Any, **kwargs: Any):
        """As :class:`~.decoder.DecoderModel`'s."""
        super().__init__(*args, **kwargs)
        self.embed_scale = torch.tensor(self.spec.hidden_size**0.5, dtype=self.dtype, device=self.embed.device)
        """As transformers scales: the factor rounded to the model's dtype first."""

    def _norm_weight(self, weight: torch.Tensor) -> torch.Tensor:
        return gemma_norm_weight(weight)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return gemma_rms_norm(self.ops, x, weight, self.spec.rms_norm_eps)

    def _embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.embed) * self.embed_scale

    def _rope(self, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Gemma 3's stacked tables: the local one for sliding-window layers, the global one for
        the others."""
        if self.cos.dim() == 2:
            return super()._rope(positions)
        cos = self.cos[:, positions].to(self.dtype)
        sin = self.sin[:, positions].to(self.dtype)
        full, local = (cos[0], sin[0]), (cos[1], sin[1])  # rope.LAYER_TYPES' order
        return [local if layer.window > 0 else full for layer in self.layers]

    def _activation(self, gate_up: torch.Tensor) -> torch.Tensor:
        return self.ops.geglu(gate_up)
