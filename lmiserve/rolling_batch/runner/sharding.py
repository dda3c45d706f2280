"""Which part of every layer a tensor-parallel rank holds (Megatron's sharding).

Attention is split by heads: a rank computes ``num_heads / N`` query heads and the KV heads
they read (``num_kv_heads / N``; when there are fewer KV heads than ranks, each rank holds a
copy of the one KV head its query heads share). The fused QKV projection holds those heads'
rows, the output projection the matching columns, and the ranks' partial outputs are summed
by an all-reduce. The MLP is split the same way: gate and up by rows (a rank's fused gate/up
is ``[gate shard; up shard]``), down by columns, then an all-reduce. Embeddings and norms are
replicated. The LM head lives on rank 0 alone, which computes the logits and samples, so no
all-gather is needed.

Torch-free: the API process refuses an uneven degree (:func:`check_shardable`) before it starts
an engine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ..models.spec import ModelSpec
from ..quant.pieces import SKIP, Piece, take_piece


@dataclasses.dataclass(frozen=True)
class Shard:
    rank: int
    world_size: int


def head_range(spec: ModelSpec, shard: Shard) -> tuple[int, int]:
    """``(first, count)`` of the query heads this rank computes."""
    count = spec.num_heads // shard.world_size
    return shard.rank * count, count


def kv_head_range(spec: ModelSpec, shard: Shard) -> tuple[int, int]:
    """``(first, count)`` of the KV heads this rank holds: its share, or the one KV head its
    query heads read when there are fewer KV heads than ranks (replicated)."""
    kv, world = spec.num_kv_heads, shard.world_size
    return shard.rank * kv // world, max(1, kv // world)


def local_spec(spec: ModelSpec, shard: Shard) -> ModelSpec:
    """The model as one rank sees it: its heads, its KV heads, its part of the MLP."""
    return dataclasses.replace(
        spec,
        num_heads=head_range(spec, shard)[1],
        num_kv_heads=kv_head_range(spec, shard)[1],
        intermediate_size=spec.intermediate_size // shard.world_size,
    )


def shard_pieces(spec: ModelSpec, shard: Shard, lm_head: bool = True) -> Callable[[str], Piece]:
    """Which rows or columns of each checkpoint tensor a rank loads (see :mod:`..quant.safetensors_weights`)."""
    d = spec.head_dim
    q0, qn = head_range(spec, shard)
    k0, kn = kv_head_range(spec, shard)
    inter = spec.intermediate_size // shard.world_size
    i0 = shard.rank * inter
    q_rows, kv_rows, mlp_rows = (0, q0 * d, (q0 + qn) * d), (0, k0 * d, (k0 + kn) * d), (0, i0, i0 + inter)
    rules: dict[str, Piece] = {
        "self_attn.q_proj.weight": q_rows,
        "self_attn.q_proj.bias": q_rows,
        "self_attn.k_proj.weight": kv_rows,
        "self_attn.k_proj.bias": kv_rows,
        "self_attn.v_proj.weight": kv_rows,
        "self_attn.v_proj.bias": kv_rows,
        "self_attn.o_proj.weight": (1, q0 * d, (q0 + qn) * d),
        # a row-parallel projection's bias is added once, by rank 0, before the all-reduce
        "self_attn.o_proj.bias": None if shard.rank == 0 else SKIP,
        "mlp.gate_proj.weight": mlp_rows,
        "mlp.up_proj.weight": mlp_rows,
        "mlp.down_proj.weight": (1, i0, i0 + inter),
    }

    def piece(name: str) -> Piece:
        if name == "lm_head.weight":
            return None if lm_head else SKIP
        return rules.get(".".join(name.split(".")[-3:]))

    return piece


def shard_state_dict(tensors: dict[str, Any], pieces: Callable[[str], Piece]) -> dict[str, Any]:
    """A rank's shard of tensors already in memory (what loading with ``pieces`` reads)."""
    shard = {}
    for name, tensor in tensors.items():
        piece = pieces(name)
        if piece != SKIP:
            shard[name] = tensor if piece is None else take_piece(tensor, piece).contiguous()  # type: ignore[arg-type]
    return shard


def _problem(spec: ModelSpec, world: int) -> str | None:
    heads, kv, inter = spec.num_heads, spec.num_kv_heads, spec.intermediate_size
    if world > 1 and spec.tp_refusal:
        return spec.tp_refusal
    if heads % world:
        return f"num_attention_heads {heads} is not divisible by tensor_parallel_degree {world}"
    if kv >= world and kv % world:
        return f"num_key_value_heads {kv} is not divisible by tensor_parallel_degree {world}"
    if kv < world and world % kv:
        return (
            f"tensor_parallel_degree {world} is not a multiple of num_key_value_heads {kv}, "
            "so the KV heads cannot be replicated evenly"
        )
    if inter % world:
        return f"intermediate_size {inter} is not divisible by tensor_parallel_degree {world}"
    return None


def check_shardable(spec: ModelSpec, world: int) -> None:
    """Refuse a model whose heads (or MLP) cannot be split evenly over ``world`` ranks."""
    if world < 1:
        raise ValueError(f"tensor_parallel_degree must be at least 1, not {world}")
    problem = _problem(spec, world)
    if problem is not None:
        fits = [n for n in range(1, spec.num_heads + 1) if _problem(spec, n) is None]
        raise ValueError(f"{problem}; degrees this model can be split over: {', '.join(map(str, fits))}")
