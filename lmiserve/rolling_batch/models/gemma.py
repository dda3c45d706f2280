"""Gemma 2 and Gemma 3 (text) over the device ops.

What differs from the generic decoder (:mod:`.decoder`):

- RMSNorm scales by ``1 + weight``, both in fp32, and only then casts back (Llama casts the
  normalised input back first); the ``1 + weight`` is formed once here, in fp32.
- Four norms a layer: before and after attention, before and after the MLP; the residual is
  added after the "post" norms.
- Embeddings are multiplied by ``sqrt(hidden)`` rounded to the model's dtype.
- The MLP is GeGLU (gelu with the tanh approximation, :meth:`~..ops.interface.Ops.geglu`).
- Attention scores are scaled by ``query_pre_attn_scalar ** -0.5``; layers alternate between a
  sliding window and global attention (``ModelSpec.layer_windows``).
- Gemma 2 caps attention scores and logits (``tanh(x / c) * c``); Gemma 3 normalises queries and
  keys per head and rotates them with a table per layer type (local and global bases).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ..ops.generated_rows import attend
from ..ops.interface import Ops
from ..ops.metadata import AttentionMetadata
from ..ops.reference import LinearWeight, split_qkv
from ..quant.weights import cat_rows
from .decoder import DecoderModel
from .spec import ModelSpec
from .weights import take


def gemma_norm_weight(weight: torch.Tensor) -> torch.Tensor:
    """``1 + weight`` in fp32: the factor Gemma's RMSNorm multiplies by."""
    return 1.0 + weight.float()


def gemma_rms_norm(ops: Ops, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma's RMSNorm over the last dimension, with ``weight`` from :func:`gemma_norm_weight`:
    normalised and scaled in fp32, then cast to ``x``'s dtype (as transformers computes it).
    That is the ops' RMSNorm of ``x`` in fp32 (so deterministic mode's fixed blocks apply)."""
    return ops.rms_norm(x.float(), weight, eps)[0].to(x.dtype)


@dataclass
class GemmaLayer:
    input_norm: torch.Tensor
    qkv: LinearWeight
    o: LinearWeight
    post_attention_norm: torch.Tensor
    pre_feedforward_norm: torch.Tensor
    gate_up: LinearWeight
    down: LinearWeight
    post_feedforward_norm: torch.Tensor
    window: int
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None


class GemmaModel(DecoderModel):
    """Gemma 2 / Gemma 3 text. ``cos``/``sin`` as :func:`.rope.rope_tables` gives them: one
    table (Gemma 2), or a global and a local table stacked (Gemma 3)."""

    def __init__(
        self,
        spec: ModelSpec,
        tensors: dict[str, Any],
        ops: Ops,
        cos: torch.Tensor,
        sin: torch.Tensor,
        all_reduce: Callable[[torch.Tensor], object] | None = None,
        lm_head: bool = True,
    ):
        super().__init__(spec, tensors, ops, cos, sin, all_reduce, lm_head)
        self.norm = gemma_norm_weight(self.norm)
        self.scale = spec.attention_scale or spec.head_dim**-0.5
        self.embed_scale = torch.tensor(spec.hidden_size**0.5, dtype=self.dtype, device=self.embed.device)
        """As transformers scales: the factor rounded to the model's dtype first."""

    def _layer(self, t: dict[str, Any], i: int) -> GemmaLayer:  # type: ignore[override]
        p = f"layers.{i}."
        a = p + "self_attn."
        spec = self.spec
        qkv_w = cat_rows([take(t, a + f"{n}_proj.weight") for n in "qkv"])
        gate_up = cat_rows([take(t, p + "mlp.gate_proj.weight"), take(t, p + "mlp.up_proj.weight")])

        def norm(name: str) -> torch.Tensor:
            return gemma_norm_weight(take(t, name))

        windows = spec.layer_windows or (spec.sliding_window,) * spec.num_layers
        return GemmaLayer(
            input_norm=norm(p + "input_layernorm.weight"),
            qkv=self.ops.prepare_linear(qkv_w),
            o=self.ops.prepare_linear(take(t, a + "o_proj.weight")),
            post_attention_norm=norm(p + "post_attention_layernorm.weight"),
            pre_feedforward_norm=norm(p + "pre_feedforward_layernorm.weight"),
            gate_up=self.ops.prepare_linear(gate_up),
            down=self.ops.prepare_linear(take(t, p + "mlp.down_proj.weight")),
            post_feedforward_norm=norm(p + "post_feedforward_layernorm.weight"),
            window=windows[i],
            q_norm=norm(a + "q_norm.weight") if spec.qk_norm else None,
            k_norm=norm(a + "k_norm.weight") if spec.qk_norm else None,
        )

    def _rope(self, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's ``(cos, sin)`` for the step's positions, in the model's dtype."""
        if self.cos.dim() == 2:
            table = (self.cos[positions].to(self.dtype), self.sin[positions].to(self.dtype))
            return [table] * len(self.layers)
        cos = self.cos[:, positions].to(self.dtype)
        sin = self.sin[:, positions].to(self.dtype)
        full, local = (cos[0], sin[0]), (cos[1], sin[1])  # rope.LAYER_TYPES' order
        return [local if layer.window > 0 else full for layer in self.layers]

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        """Hidden states ``(T, hidden)`` after the final norm, for every token of the step."""
        ops, spec = self.ops, self.spec
        eps = spec.rms_norm_eps
        heads, kv_heads, dim = spec.num_heads, spec.num_kv_heads, spec.head_dim
        rope = self._rope(positions)
        residual = F.embedding(input_ids, self.embed) * self.embed_scale
        tokens = residual.shape[0]
        lora = None
        if meta.lora is not None and self.lora is not None:
            lora = {group: meta.lora.only(slots) for group, slots in self.lora.holds.items()}
        for i, (layer, (k_cache, v_cache)) in enumerate(zip(self.layers, kv_caches)):
            cos, sin = rope[i]
            x = gemma_rms_norm(ops, residual, layer.input_norm, eps)
            qkv = ops.linear(x, layer.qkv)
            if lora is not None:
                self._adapt(qkv, x, i, "qkv", lora)
            if layer.q_norm is None:
                q = ops.rotate_and_store(qkv, heads, cos, sin, k_cache, v_cache, meta.slot_mapping)
            else:  # queries and keys normalised per head before the rotation (Gemma 3)
                q, k, v = split_qkv(qkv, heads, kv_heads, dim)
                q = gemma_rms_norm(ops, q, layer.q_norm, eps)
                k = gemma_rms_norm(ops, k, layer.k_norm, eps)
                q, k = ops.rotary(q, k, cos, sin)
                ops.write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
            attn = attend(ops, q, k_cache, v_cache, meta.paged, self.scale, layer.window, spec.attn_softcap)
            attn = attn.view(tokens, -1)
            o = self._row_linear(attn, layer.o)
            if lora is not None:
                self._adapt(o, attn, i, "o", lora)
            residual = residual + gemma_rms_norm(ops, o, layer.post_attention_norm, eps)
            x = gemma_rms_norm(ops, residual, layer.pre_feedforward_norm, eps)
            gate_up = ops.linear(x, layer.gate_up)
            if lora is not None:
                self._adapt(gate_up, x, i, "gate_up", lora)
            act = ops.geglu(gate_up)
            mlp = self._row_linear(act, layer.down)
            if lora is not None:
                self._adapt(mlp, act, i, "down", lora)
            residual = residual + gemma_rms_norm(ops, mlp, layer.post_feedforward_norm, eps)
        return gemma_rms_norm(ops, residual, self.norm, eps)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head's output, capped (``final_logit_softcapping``) in the model's dtype as
        transformers caps it, then in fp32."""
        logits = self.ops.linear(hidden, self.lm_head)
        cap = self.spec.final_softcap
        if cap > 0:
            logits = torch.tanh(logits / cap) * cap
        return logits.float()
