"""Whether a model splits evenly over tensor-parallel ranks (torch-free: the API process refuses
an uneven degree before it starts an engine)."""

from __future__ import annotations

from .models.spec import ModelSpec


def _problem(spec: ModelSpec, world: int) -> str | None:
    heads, kv, inter = spec.num_heads, spec.num_kv_heads, spec.intermediate_size
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
