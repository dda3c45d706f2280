"""The generic decoder-only transformer (RMSNorm, rotary attention with GQA, SwiGLU MLP).

Weights are held in plain attributes, not nn.Modules: a decode step calls each op directly,
with no module machinery in between. Projections are fused (QKV, gate/up) so each layer runs
three matrix multiplies before the down projection.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ..ops.interface import Ops
from ..ops.metadata import AttentionMetadata, LoraStep
from ..ops.reference import LinearWeight, split_qkv
from ..quant.weights import cat_rows, dense
from .spec import ModelSpec
from .weights import maybe, take


@dataclass
class Layer:
    input_norm: torch.Tensor
    qkv: LinearWeight
    o: LinearWeight
    post_norm: torch.Tensor
    gate_up: LinearWeight
    down: LinearWeight
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None


class DecoderModel:
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
        """``spec`` gives the heads and MLP width this process computes; with tensor parallelism
        that is its shard, and ``all_reduce`` sums the shards' outputs of the row-parallel
        projections (o and down). Ranks that compute no logits pass ``lm_head=False``."""
        self.spec = spec
        self.ops = ops
        self._all_reduce = all_reduce
        self._row_linear = ops.linear if all_reduce is None else self._linear_all_reduce
        embed = take(tensors, "embed_tokens.weight")
        self.norm = take(tensors, "norm.weight")
        self.dtype = self.norm.dtype
        self.embed = dense(embed, self.dtype)
        """The token embeddings, dense (a step reads only its tokens' rows; a tied LM head is
        this dense weight too)."""
        self.cos = cos.to(self.embed.device)
        self.sin = sin.to(self.embed.device)
        self.layers = [self._layer(tensors, i) for i in range(spec.num_layers)]
        head = tensors.get("lm_head.weight")
        self.lm_head = None
        if lm_head:
            # tied: the dense embeddings (held for the lookup anyway) rather than their blocks
            self.lm_head = ops.prepare_linear(self.embed if spec.tie_word_embeddings or head is None else head)
        self.scale = spec.head_dim**-0.5
        self.lora: Any = None
        """The adapters' device slots (:class:`..lora.pool.LoraPool`), when LoRA is enabled."""

    def _layer(self, t: dict[str, Any], i: int) -> Layer:
        p = f"layers.{i}."
        a = p + "self_attn."
        qkv_w = cat_rows([take(t, a + f"{n}_proj.weight") for n in "qkv"])
        qkv_b = None
        if self.spec.qkv_bias:
            qkv_b = torch.cat([take(t, a + f"{n}_proj.bias") for n in "qkv"], dim=0)
        gate_up = cat_rows([take(t, p + "mlp.gate_proj.weight"), take(t, p + "mlp.up_proj.weight")])
        return Layer(
            input_norm=take(t, p + "input_layernorm.weight"),
            qkv=self.ops.prepare_linear(qkv_w, qkv_b),
            o=self.ops.prepare_linear(take(t, a + "o_proj.weight"), maybe(t, a + "o_proj.bias")),
            post_norm=take(t, p + "post_attention_layernorm.weight"),
            gate_up=self.ops.prepare_gate_up(gate_up),
            down=self.ops.prepare_linear(take(t, p + "mlp.down_proj.weight")),
            q_norm=maybe(t, a + "q_norm.weight") if self.spec.qk_norm else None,
            k_norm=maybe(t, a + "k_norm.weight") if self.spec.qk_norm else None,
        )

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
        cos = self.cos[positions].to(self.dtype)
        sin = self.sin[positions].to(self.dtype)
        h = F.embedding(input_ids, self.embed)
        tokens = h.shape[0]
        residual = h
        x, _ = ops.rms_norm(h, self.layers[0].input_norm, eps)
        last = len(self.layers) - 1
        lora = None
        if meta.lora is not None and self.lora is not None:  # each projection's runs, once per step
            lora = {group: meta.lora.only(slots) for group, slots in self.lora.holds.items()}
        for i, (layer, (k_cache, v_cache)) in enumerate(zip(self.layers, kv_caches)):
            qkv = ops.linear(x, layer.qkv)
            if lora is not None:
                self._adapt(qkv, x, i, "qkv", lora)
            if layer.q_norm is None:
                q = ops.rotate_and_store(qkv, spec.num_heads, cos, sin, k_cache, v_cache, meta.slot_mapping)
            else:  # q and k normalised per head before the rotation (Qwen3)
                q, k, v = split_qkv(qkv, spec.num_heads, spec.num_kv_heads, spec.head_dim)
                q, _ = ops.rms_norm(q, layer.q_norm, eps)
                k, _ = ops.rms_norm(k, layer.k_norm, eps)
                q, k = ops.rotary(q, k, cos, sin)
                ops.write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
            attn = ops.attention(q, k_cache, v_cache, meta.paged, self.scale, spec.sliding_window).view(tokens, -1)
            o = self._row_linear(attn, layer.o)
            if lora is not None:
                self._adapt(o, attn, i, "o", lora)
            x, residual = ops.add_rms_norm(o, residual, layer.post_norm, eps)
            if lora is None:
                act = ops.gate_up_swiglu(x, layer.gate_up)
            else:  # the adapters add to gate_up before the activation
                gate_up = ops.linear(x, layer.gate_up)
                self._adapt(gate_up, x, i, "gate_up", lora)
                act = ops.swiglu(gate_up)
            mlp = self._row_linear(act, layer.down)
            if lora is not None:
                self._adapt(mlp, act, i, "down", lora)
            next_norm = self.norm if i == last else self.layers[i + 1].input_norm
            x, residual = ops.add_rms_norm(mlp, residual, next_norm, eps)
        return x

    def _adapt(
        self, y: torch.Tensor, x: torch.Tensor, layer: int, group: str, lora: dict[str, LoraStep | None]
    ) -> None:
        """Add the low-rank updates of the adapters in the step that adapt this projection."""
        runs = lora[group]
        if runs is not None:
            a, b = self.lora.layers[layer][group]
            self.ops.lora_add(y, x, a, b, runs, self.lora.parts[group])

    def _linear_all_reduce(self, x: torch.Tensor, w: LinearWeight) -> torch.Tensor:
        y = self.ops.linear(x, w)
        self._all_reduce(y)  # type: ignore[misc]
        return y

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.ops.linear(hidden, self.lm_head).float()


def decoder_class(spec: ModelSpec) -> type[DecoderModel]:
    """The model for a spec: the generic decoder unless its family has a module of its own."""
    if spec.architecture in ("gemma2", "gemma3"):
        from .gemma import GemmaModel

        return GemmaModel
    return DecoderModel
