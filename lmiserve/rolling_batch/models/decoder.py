"""The generic decoder-only transformer (RMSNorm, rotary attention with GQA, SwiGLU MLP).

Weights are held in plain attributes, not nn.Modules: a decode step calls each op directly,
with no module machinery in between. Projections are fused (QKV, gate/up) so each layer runs
three matrix multiplies before the down projection.

What differs between families is declared in the spec (:class:`.spec.ModelSpec`) or, where it
is computed otherwise, in a subclass that overrides the hooks: how a norm's weight is held
(:meth:`DecoderModel._norm_weight`) and applied (:meth:`DecoderModel._norm`), the embeddings
(:meth:`DecoderModel._embed`), each layer's rotary tables (:meth:`DecoderModel._rope`) and the
MLP's activation (:meth:`DecoderModel._activation`); :mod:`.gemma` is one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ..ops.interface import Ops
from ..ops.metadata import AttentionMetadata, LoraStep
from ..ops.reference import LinearWeight
from ..quant.weights import dense, is_quantized
from .image_attention import ImageBlock, attend_image_blocks
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
    """``post_attention_layernorm``: before the MLP (pre-norm placement), on the attention's output
    (post-norm and sandwich placements)."""
    pre_mlp_norm: torch.Tensor
    """The MLP's input norm: ``post_norm`` itself, or the sandwich placement's
    ``pre_feedforward_layernorm``."""
    gate_up: LinearWeight | None
    down: LinearWeight | None
    window: int = 0
    """This layer's sliding window (0: global attention)."""
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None
    mlp_norm: torch.Tensor | None = None
    """With post-norm and sandwich placements, on the MLP's output."""
    moe: MoeLayer | None = None
    """The experts that replace the dense MLP (gate_up and down None) in a mixture-of-experts layer."""


class DecoderModel:
    GATED_SWIGLU = True
    """The MLP is SwiGLU, which the ops may run fused with its gate/up product
    (:meth:`~..ops.interface.Ops.gate_up_swiglu`)."""
    aux_layers: tuple[int, ...] = ()
    """Layers whose input the forward pass keeps in :attr:`aux_hidden` (EAGLE-3 reads them): entry
    ``k`` is the residual stream entering layer ``k`` (0: the embeddings; ``num_layers``: the stream
    before the final norm), as vLLM and EAGLE number them. Empty (the default): nothing is kept."""
    aux_hidden: torch.Tensor | None = None
    """``(T, len(aux_layers) * hidden)``: the last forward pass's streams at :attr:`aux_layers`, in
    their order, concatenated along the last dimension (None until a pass with aux_layers set)."""

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
        norm = take(tensors, "norm.weight")
        self.dtype = norm.dtype
        self.norm = self._norm_weight(norm)
        self.embed = dense(embed, self.dtype)
        """The token embeddings, dense (a step reads only its tokens' rows; a tied LM head is
        this dense weight too)."""
        self.cos = cos.to(self.embed.device)
        self.sin = sin.to(self.embed.device)
        self.layers = [self._layer(tensors, i) for i in range(spec.num_layers)]
        head = tensors.get("lm_head.weight")
        self.lm_head = None
        if lm_head:
            # tied: the dense embeddings (held for the lookup anyway), or their blocks where the
            # loader kept them (int8 activations: the blocks are the faster head there)
            tied = embed if is_quantized(embed) else self.embed
            self.lm_head = ops.prepare_linear(tied if spec.tie_word_embeddings or head is None else head)
        self.scale = spec.attention_scale or spec.head_dim**-0.5
        self._mrope_pick: torch.Tensor | None = None
        self.lora: Any = None
        """The adapters' device slots (:class:`..lora.pool.LoraPool`), when LoRA is enabled."""

    def _layer(self, t: dict[str, Any], i: int) -> Layer:
        p = f"layers.{i}."
        a = p + "self_attn."
        spec, norm = self.spec, self._norm_weight
        qkv_w, qkv_b = fused_qkv(t, a, spec.qkv_bias)
        moe = load_moe_layer(t, i, spec, self.ops)
        gate_up = down = None
        if moe is None:
            prepare_gate_up = self.ops.prepare_gate_up if self.GATED_SWIGLU else self.ops.prepare_linear
            gate_up = prepare_gate_up(fused_gate_up(t, p + "mlp."))
            down = self.ops.prepare_linear(take(t, p + "mlp.down_proj.weight"))
        placement = spec.norm_placement
        post_norm = norm(take(t, p + "post_attention_layernorm.weight"))
        sandwich = placement == "sandwich"
        pre_mlp_norm = norm(take(t, p + "pre_feedforward_layernorm.weight")) if sandwich else post_norm
        q_norm, k_norm = (
            (maybe(t, a + "q_norm.weight"), maybe(t, a + "k_norm.weight")) if spec.qk_norm else (None, None)
        )
        return Layer(
            input_norm=None if placement == "post" else norm(take(t, p + "input_layernorm.weight")),
            qkv=self.ops.prepare_linear(qkv_w, qkv_b),
            o=self.ops.prepare_linear(take(t, a + "o_proj.weight"), maybe(t, a + "o_proj.bias")),
            post_norm=post_norm,
            pre_mlp_norm=pre_mlp_norm,
            gate_up=gate_up,
            down=down,
            window=spec.layer_windows[i] if spec.layer_windows else spec.sliding_window,
            q_norm=None if q_norm is None else norm(q_norm),
            k_norm=None if k_norm is None else norm(k_norm),
            mlp_norm=None if placement == "pre" else norm(take(t, p + "post_feedforward_layernorm.weight")),
            moe=moe,
        )

    # --- what a family may compute otherwise ----------------------------------------------
    def _norm_weight(self, weight: torch.Tensor) -> torch.Tensor:
        """A norm's weight as :meth:`_norm` takes it (as stored)."""
        return weight

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """RMSNorm over the last dimension (the ops')."""
        return self.ops.rms_norm(x, weight, self.spec.rms_norm_eps)[0]

    def _embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The step's token embeddings (times ``spec.embedding_multiplier``)."""
        h = F.embedding(input_ids, self.embed)
        if self.spec.embedding_multiplier != 1.0:
            h = h * self.spec.embedding_multiplier
        return h

    def _rope(self, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's ``(cos, sin)`` for the step's positions, in the model's dtype (one table)."""
        table = (self.cos[positions].to(self.dtype), self.sin[positions].to(self.dtype))
        return [table] * len(self.layers)

    def _mrope(self, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Multimodal rotary tables: each frequency takes the temporal, height or width position
        of its section (``spec.mrope_section``: three runs, or interleaved), in both halves of the head."""
        if self._mrope_pick is None:  # each frequency's section, in both halves of the head: once
            sections = self.spec.mrope_section
            if self.spec.mrope_interleaved:  # T H W T H W ... while height and width last, then T
                half = torch.zeros(sum(sections), dtype=torch.long)
                for axis in (1, 2):
                    half[axis : 3 * sections[axis] : 3] = axis
            else:
                half = torch.repeat_interleave(torch.arange(len(sections)), torch.tensor(sections))
            self._mrope_pick = torch.cat([half, half]).to(positions.device).view(1, 1, -1)
        pick = self._mrope_pick.expand(1, positions.shape[1], -1)
        cos = self.cos[positions].gather(0, pick)[0].to(self.dtype)
        sin = self.sin[positions].gather(0, pick)[0].to(self.dtype)
        return [(cos, sin)] * len(self.layers)

    def _activation(self, gate_up: torch.Tensor) -> torch.Tensor:
        """The MLP's gated activation of the gate/up product (SwiGLU)."""
        return self.ops.swiglu(gate_up)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        inserts: tuple[torch.Tensor, torch.Tensor] | None = None,
        rope_positions: torch.Tensor | None = None,
        image_blocks: list[ImageBlock] | None = None,
    ) -> torch.Tensor:
        """Hidden states ``(T, hidden)`` after the final norm, for every token of the step.
        ``inserts``: ``(rows, embeddings)``, input embeddings that take the place of those rows'
        token embeddings (an image's, at its placeholder tokens); embeddings ``k + 1`` times as wide
        as the model carry ``k`` more (Qwen3-VL's DeepStack features), added to those rows of the
        first ``k`` layers' outputs. ``rope_positions``: ``(3, T)``
        multimodal rotary positions (``spec.mrope_section``) in place of ``positions``.
        ``image_blocks``: pictures whose tokens attend to each other both ways (Gemma 3)."""
        ops, spec = self.ops, self.spec
        rope = self._rope(positions) if rope_positions is None else self._mrope(rope_positions)
        h = self._embed(input_ids)
        stacked: list[torch.Tensor] = []
        if inserts is not None:
            width = h.shape[1]
            h = h.index_copy(0, inserts[0], inserts[1][:, :width].to(h.dtype))
            if inserts[1].shape[1] > width:
                stacked = list(inserts[1][:, width:].split(width, dim=1))
        tokens = h.shape[0]
        residual = h
        x = h if self.layers[0].input_norm is None else self._norm(h, self.layers[0].input_norm)
        last = len(self.layers) - 1
        lora = None
        if meta.lora is not None and self.lora is not None:  # each projection's runs, once per step
            lora = {group: meta.lora.only(slots) for group, slots in self.lora.holds.items()}
        aux = self.aux_layers
        kept: dict[int, torch.Tensor] = {}
        for i, (layer, (k_cache, v_cache)) in enumerate(zip(self.layers, kv_caches)):
            if aux and i in aux:  # a copy: the ops may add to the residual in place
                kept[i] = residual.clone()
            cos, sin = rope[i]
            qkv = ops.linear(x, layer.qkv)
            if lora is not None:
                self._adapt(qkv, x, i, "qkv", lora)
            if layer.q_norm is None:
                q = ops.rotate_and_store(qkv, spec.num_heads, cos, sin, k_cache, v_cache, meta.slot_mapping)
            else:  # q and k normalised before the rotation (Qwen3 and Gemma 3 per head, OLMo 2 as a whole)
                q, k, v = normed_qkv(
                    qkv, spec.num_heads, spec.num_kv_heads, spec.head_dim,
                    layer.q_norm, layer.k_norm, self._norm, spec.qk_norm_scope,
                )  # fmt: skip
                q, k = ops.rotary(q, k, cos, sin)
                ops.write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
            attn = ops.attention(q, k_cache, v_cache, meta.paged, self.scale, layer.window, spec.attn_softcap)
            if image_blocks:
                attn = attend_image_blocks(
                    q, k_cache, v_cache, attn, image_blocks, self.scale, layer.window, spec.attn_softcap
                )
            attn = attn.view(tokens, -1)
            o = self._row_linear(attn, layer.o)
            if lora is not None:
                self._adapt(o, attn, i, "o", lora)
            x, residual = self._join(o, residual, layer.post_norm, layer.pre_mlp_norm)
            next_norm = self.norm if i == last else self.layers[i + 1].input_norm
            if layer.moe is not None:
                if lora is not None and (lora.get("gate_up") or lora.get("down")):
                    raise UnsupportedModel("MLP adapters on mixture-of-experts layers are not supported")
                x, residual = self._join(moe_mlp(ops, x, layer.moe), residual, layer.mlp_norm, next_norm)
                continue
            if lora is None and self.GATED_SWIGLU:
                act = ops.gate_up_swiglu(x, layer.gate_up)
            else:  # the adapters add to gate_up before the activation
                gate_up = ops.linear(x, layer.gate_up)
                if lora is not None:
                    self._adapt(gate_up, x, i, "gate_up", lora)
                act = self._activation(gate_up)
            mlp = self._row_linear(act, layer.down)
            if lora is not None:
                self._adapt(mlp, act, i, "down", lora)
            x, residual = self._join(mlp, residual, layer.mlp_norm, next_norm)
            if i < len(stacked):  # a DeepStack feature joins the residual after this layer
                residual = residual.index_add(0, inserts[0], stacked[i].to(residual.dtype))  # type: ignore[index]
                x = self._norm(residual, next_norm)  # type: ignore[arg-type]
        if aux:
            if len(self.layers) in aux:
                kept[len(self.layers)] = residual.clone()
            self.aux_hidden = torch.cat([kept[k] for k in aux], dim=-1)
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
        layer). Sandwich: ``branch_norm`` normalises ``out`` before it joins, and ``next_norm``
        the residual into the next input."""
        if self.spec.residual_multiplier != 1.0:
            out.mul_(self.spec.residual_multiplier)
        placement = self.spec.norm_placement
        if placement == "pre":
            return self.ops.add_rms_norm(out, residual, next_norm, self.spec.rms_norm_eps)  # type: ignore[arg-type]
        residual = residual + self._norm(out, branch_norm)  # type: ignore[arg-type]
        if placement == "sandwich" or next_norm is self.norm:
            return self._norm(residual, next_norm), residual  # type: ignore[arg-type]
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
        """The LM head's output divided by ``logits_scaling`` and capped (``final_softcap``) in
        the model's dtype, as transformers computes them, then in fp32."""
        logits = self.ops.linear(hidden, self.lm_head)
        if self.spec.logits_scaling != 1.0:
            logits = logits / self.spec.logits_scaling
        cap = self.spec.final_softcap
        if cap > 0:
            logits = torch.tanh(logits / cap) * cap
        return logits.float()
