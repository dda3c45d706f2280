"""Mixture-of-experts MLPs (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE) over the device ops.

A router scores the experts per token; each family's routing (a softmax in fp32, the top k,
renormalised or not, the weights rounded to the model's dtype or kept in fp32) is computed here,
and :meth:`~..ops.interface.Ops.fused_moe` runs the chosen experts. Qwen2-MoE adds a shared
expert, a dense SwiGLU MLP scaled per token by a sigmoid gate.

Experts are read from either layout a checkpoint may hold: one tensor per expert and projection
(``experts.N.gate_proj`` / ``up_proj`` / ``down_proj``, Mixtral's ``experts.N.w1`` / ``w3`` /
``w2``), or one 3-D tensor per layer (``experts.gate_up_proj`` ``(E, 2I, H)``,
``experts.down_proj`` ``(E, H, I)``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..ops.interface import ExpertWeights, LinearWeight, Ops
from ..quant.weights import is_quantized
from .spec import ModelSpec, UnsupportedModel
from .weights import take

_NAMES = {"block_sparse_moe": ("w1", "w3", "w2"), "mlp": ("gate_proj", "up_proj", "down_proj")}
"""Per-expert weight names (gate, up, down) by where the layer's experts live."""


@dataclass
class MoeLayer:
    router: LinearWeight
    experts: ExpertWeights
    top_k: int
    normalize: bool
    rounded: bool
    shared_gate_up: LinearWeight | None = None
    shared_down: LinearWeight | None = None
    shared_gate: LinearWeight | None = None


def _pop(tensors: dict[str, Any], name: str) -> Any:
    """``take``, and the tensor no longer held by ``tensors`` (stacking experts copies them)."""
    value = take(tensors, name)
    for candidate in (name, f"model.{name}"):
        tensors.pop(candidate, None)
    return value


def _dense(t: Any, name: str) -> torch.Tensor:
    if is_quantized(t):
        raise UnsupportedModel(f"quantized experts are not supported ({name})")
    return t


def _experts(tensors: dict[str, Any], prefix: str, spec: ModelSpec) -> tuple[torch.Tensor, torch.Tensor]:
    fused = f"{prefix}experts.gate_up_proj"
    if fused in tensors or f"model.{fused}" in tensors:
        w13 = _dense(_pop(tensors, fused), fused)
        w2 = _dense(_pop(tensors, f"{prefix}experts.down_proj"), "down_proj")
        return w13, w2
    gate, up, down = _NAMES[spec.moe_prefix]
    w13, w2 = [], []
    for e in range(spec.num_experts):
        p = f"{prefix}experts.{e}."
        g = _dense(_pop(tensors, p + f"{gate}.weight"), p + gate)
        u = _dense(_pop(tensors, p + f"{up}.weight"), p + up)
        w13.append(torch.cat([g, u], dim=0))
        w2.append(_dense(_pop(tensors, p + f"{down}.weight"), p + down))
    return torch.stack(w13), torch.stack(w2)


def load_moe_layer(tensors: dict[str, Any], i: int, spec: ModelSpec, ops: Ops) -> MoeLayer | None:
    """Layer ``i``'s router and experts (and shared expert), prepared; None for a dense MLP layer."""
    if not spec.num_experts or i in spec.dense_mlp_layers:
        return None
    prefix = f"layers.{i}.{spec.moe_prefix}."
    w13, w2 = _experts(tensors, prefix, spec)
    layer = MoeLayer(
        router=ops.prepare_linear(_dense(_pop(tensors, prefix + "gate.weight"), prefix + "gate")),
        experts=ops.prepare_experts(w13, w2),
        top_k=spec.experts_per_token,
        normalize=spec.norm_topk_prob,
        rounded=spec.router_weights_rounded,
    )
    if spec.shared_expert_intermediate_size:
        s = prefix + "shared_expert."
        gate_up = torch.cat([take(tensors, s + "gate_proj.weight"), take(tensors, s + "up_proj.weight")], dim=0)
        layer.shared_gate_up = ops.prepare_gate_up(gate_up)
        layer.shared_down = ops.prepare_linear(take(tensors, s + "down_proj.weight"))
        layer.shared_gate = ops.prepare_linear(take(tensors, prefix + "shared_expert_gate.weight"))
    return layer


def route(
    logits: torch.Tensor, top_k: int, normalize: bool, rounded_to: torch.dtype | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weights (T, k) fp32, ids (T, k) int32)``: softmax over the experts in fp32, the top k,
    renormalised if ``normalize``, then rounded to ``rounded_to`` where the family does that."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    if rounded_to is not None:
        weights = weights.to(rounded_to).float()
    return weights, ids.to(torch.int32)


def moe_mlp(ops: Ops, x: torch.Tensor, layer: MoeLayer) -> torch.Tensor:
    """The layer's MLP output for ``x`` ``(T, hidden)`` (after the post-attention norm)."""
    logits = ops.linear(x, layer.router)
    weights, ids = route(logits, layer.top_k, layer.normalize, x.dtype if layer.rounded else None)
    y = ops.fused_moe(x, weights, ids, layer.experts)
    if layer.shared_gate_up is not None:
        shared = ops.linear(ops.gate_up_swiglu(x, layer.shared_gate_up), layer.shared_down)  # type: ignore[arg-type]
        gate = torch.sigmoid(ops.linear(x, layer.shared_gate))  # type: ignore[arg-type]
        y = y + gate * shared
    return y
