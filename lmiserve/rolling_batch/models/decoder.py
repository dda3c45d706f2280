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

from ..ops.generated_rows import attend
from ..ops.interface import Ops
from ..ops.metadata import AttentionMetadata, LoraStep
from ..ops.reference import LinearWeight
from ..quant.weights import dense
from .layer_parts import fused_gate_up, fused_qkv, normed_qkv
from .moe import MoeLayer, load_moe_layer, moe_mlp
from .spec import ModelSpec, UnsupportedModel
from .weights import maybe, take


@dataclass
class Layer:
    input_norm: torch.Tensor | None
    """None where the norms follow the branches (``spec.norm_placement == "post"``)."""
    qkv: LinearWeight
    o: LinearWeight
    post_norm: torch.Tensor
    """Before the MLP; with post-norm placement, on the attention's output."""
    gate_up: LinearWeight | None
    down: LinearWeight | None
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None
    mlp_norm: torch.Tensor | None = None
    """With post-norm placement, on the MLP's output."""
    moe: MoeLayer | None = None
    """The experts that replace the dense MLP (gate_up and down None) in a mixture-of-experts layer."""


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
        if spec.num_experts and all_reduce is not None:
            raise UnsupportedModel("mixture-of-experts models do not run tensor parallel")
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
        self.scale = spec.attention_scale or spec.head_dim**-0.5
        self.lora: Any = None
        """The adapters' device slots (:class:`..lora.pool.LoraPool`), when LoRA is enabled."""

    def _layer(self, t: dict[str, Any], i: int) -> Layer:
        p = f"layers.{i}."
        a = p + "self_attn."
        qkv_w, qkv_b = fused_qkv(t, a, self.spec.qkv_bias)
        moe = load_moe_layer(t, i, self.spec, self.ops)
        gate_up = down = None
        if moe is None:
            gate_up = self.ops.prepare_gate_up(fused_gate_up(t, p + "mlp."))
            down = self.ops.prepare_linear(take(t, p + "mlp.down_proj.weight"))
        post = self.spec.norm_placement == "post"
        return Layer(
            input_norm=None if post else take(t, p + "input_layernorm.weight"),
            qkv=self.ops.prepare_linear(qkv_w, qkv_b),
            o=self.ops.prepare_linear(take(t, a + "o_proj.weight"), maybe(t, a + "o_proj.bias")),
            post_norm=take(t, p + "post_attention_layernorm.weight"),
            gate_up=gate_up,
            down=down,
            q_norm=maybe(t, a + "q_norm.weight") if self.spec.qk_norm else None,
            k_norm=maybe(t, a + "k_norm.weight") if self.spec.qk_norm else None,
            mlp_norm=take(t, p + "post_feedforward_layernorm.weight") if post else None,
            moe=moe,
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
        if spec.embedding_multiplier != 1.0:
            h = h * spec.embedding_multiplier
        tokens = h.shape[0]
        residual = h
        x = h if self.layers[0].input_norm is None else ops.rms_norm(h, self.layers[0].input_norm, eps)[0]
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
            else:  # q and k normalised before the rotation (Qwen3 per head, OLMo 2 as a whole)
                q, k, v = normed_qkv(
                    ops, qkv, spec.num_heads, spec.num_kv_heads, spec.head_dim,
                    layer.q_norm, layer.k_norm, eps, spec.qk_norm_scope,
                )  # fmt: skip
                q, k = ops.rotary(q, k, cos, sin)
                ops.write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
            attn = attend(ops, q, k_cache, v_cache, meta.paged, self.scale, spec.sliding_window).view(tokens, -1)
            o = self._row_linear(attn, layer.o)
            if lora is not None:
                self._adapt(o, attn, i, "o", lora)
            x, residual = self._join(o, residual, layer.post_norm, layer.post_norm)
            next_norm = self.norm if i == last else self.layers[i + 1].input_norm
            if layer.moe is not None:
                if lora is not None and (lora.get("gate_up") or lora.get("down")):
                    raise UnsupportedModel("MLP adapters on mixture-of-experts layers are not supported")
                x, residual = self._join(moe_mlp(ops, x, layer.moe), residual, layer.mlp_norm, next_norm)
                continue
            if lora is None:
                act = ops.gate_up_swiglu(x, layer.gate_up)
            else:  # the adapters add to gate_up before the activation
                gate_up = ops.linear(x, layer.gate_up)
                self._adapt(gate_up, x, i, "gate_up", lora)
                act = ops.swiglu(gate_up)
            mlp = self._row_linear(act, layer.down)
            if lora is not None:
                self._adapt(mlp, act, i, "down", lora)
            x, residual = self._join(mlp, residual, layer.mlp_norm, next_norm)
        return x

    def _join(
        self,
        out: torch.Tensor,
        residual: torch.Tensor,
        branch_norm: torch.Tensor | None,
        next_norm: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A branch's output joins the residual: ``(next input, residual)``. Pre-norm: the
        residual grows by ``out`` (times ``residual_multiplier``) and ``next_norm`` normalises the
        next input. Post-norm: ``branch_norm`` normalises ``out`` before it joins, and the next
        input is the residual itself (the final norm, ``self.norm``, still applies after the last
        layer)."""
        eps = self.spec.rms_norm_eps
        if self.spec.residual_multiplier != 1.0:
            out.mul_(self.spec.residual_multiplier)
        if self.spec.norm_placement == "pre":
            return self.ops.add_rms_norm(out, residual, next_norm, eps)  # type: ignore[arg-type]
        residual = residual + self.ops.rms_norm(out, branch_norm, eps)[0]  # type: ignore[arg-type]
        if next_norm is self.norm:
            return self.ops.rms_norm(residual, self.norm, eps)[0], residual
        return residual, residual

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
        logits = self.ops.linear(hidden, self.lm_head)
        if self.spec.logits_scaling != 1.0:
            logits = logits / self.spec.logits_scaling
        return logits.float()


def decoder_class(spec: ModelSpec) -> type[DecoderModel]:
    """The model for a spec: the generic decoder unless its family has a module of its own."""
    if spec.architecture in ("gemma2", "gemma3"):
        from .gemma import GemmaModel

        return GemmaModel
    return DecoderModel
