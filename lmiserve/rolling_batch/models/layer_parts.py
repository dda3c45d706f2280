"""Pieces of a decoder layer that differ between families: fused projections read from
separate or already fused checkpoint tensors, and q/k normalisation per head or over the
whole projections."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..ops.reference import split_qkv
from ..quant.weights import cat_rows
from .weights import maybe, take


def fused_qkv(t: dict[str, Any], attn: str, bias: bool) -> tuple[Any, torch.Tensor | None]:
    """The QKV projection's weight (and bias when ``bias``) as ``[q; k; v]`` rows: the fused
    ``qkv_proj`` tensor where the checkpoint stores one (Phi-3), else q, k and v stacked."""
    fused = maybe(t, attn + "qkv_proj.weight")
    if fused is not None:
        return fused, take(t, attn + "qkv_proj.bias") if bias else None
    weight = cat_rows([take(t, attn + f"{n}_proj.weight") for n in "qkv"])
    if not bias:
        return weight, None
    return weight, torch.cat([take(t, attn + f"{n}_proj.bias") for n in "qkv"], dim=0)


def fused_gate_up(t: dict[str, Any], mlp: str) -> Any:
    """The gate/up projection as ``[gate; up]`` rows: the fused ``gate_up_proj`` (Phi-3, stored in
    that order) or gate and up stacked."""
    fused = maybe(t, mlp + "gate_up_proj.weight")
    if fused is not None:
        return fused
    return cat_rows([take(t, mlp + "gate_proj.weight"), take(t, mlp + "up_proj.weight")])


def normed_qkv(
    qkv: torch.Tensor,
    heads: int,
    kv_heads: int,
    head_dim: int,
    q_norm: torch.Tensor,
    k_norm: torch.Tensor,
    norm: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    scope: str = "head",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Queries ``(T, heads, D)``, keys and values ``(T, kv_heads, D)`` from the fused projection,
    q and k normalised by ``norm(x, weight)`` (the model's RMSNorm) before the rotation: each
    head with a ``(D,)`` weight (``"head"``, Qwen3 and Gemma 3), or all of q and all of k with
    ``(heads D,)`` and ``(kv_heads D,)`` weights (``"projection"``, OLMo 2 and OLMoE)."""
    q, k, v = split_qkv(qkv, heads, kv_heads, head_dim)
    if scope == "head":
        return norm(q, q_norm), norm(k, k_norm), v
    if scope != "projection":
        raise ValueError(f"unknown q/k norm scope {scope!r}")
    tokens = qkv.shape[0]
    q = norm(q.view(tokens, heads * head_dim), q_norm)
    k = norm(k.view(tokens, kv_heads * head_dim), k_norm)
    return q.view(tokens, heads, head_dim), k.view(tokens, kv_heads, head_dim), v
