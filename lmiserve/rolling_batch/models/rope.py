"""Rotary position embedding tables, computed exactly as the model family's own code does."""

from __future__ import annotations

import importlib
from pathlib import Path

import torch

from .spec import read_config

_ROTARY_CLASSES = {
    "llama": ("transformers.models.llama.modeling_llama", "LlamaRotaryEmbedding"),
    "mistral": ("transformers.models.mistral.modeling_mistral", "MistralRotaryEmbedding"),
    "qwen2": ("transformers.models.qwen2.modeling_qwen2", "Qwen2RotaryEmbedding"),
    "qwen3": ("transformers.models.qwen3.modeling_qwen3", "Qwen3RotaryEmbedding"),
    "mixtral": ("transformers.models.mixtral.modeling_mixtral", "MixtralRotaryEmbedding"),
    "qwen2_moe": ("transformers.models.qwen2_moe.modeling_qwen2_moe", "Qwen2MoeRotaryEmbedding"),
    "qwen3_moe": ("transformers.models.qwen3_moe.modeling_qwen3_moe", "Qwen3MoeRotaryEmbedding"),
    "olmoe": ("transformers.models.olmoe.modeling_olmoe", "OlmoeRotaryEmbedding"),
    "phi3": ("transformers.models.phi3.modeling_phi3", "Phi3RotaryEmbedding"),
    "olmo2": ("transformers.models.olmo2.modeling_olmo2", "Olmo2RotaryEmbedding"),
    "granite": ("transformers.models.granite.modeling_granite", "GraniteRotaryEmbedding"),
    "gemma2": ("transformers.models.gemma2.modeling_gemma2", "Gemma2RotaryEmbedding"),
    "gemma3": ("transformers.models.gemma3.modeling_gemma3", "Gemma3RotaryEmbedding"),
}
PLAIN_DEFAULT = {"llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "olmo2", "granite"}
"""Families whose rotary class, for unscaled ("default") RoPE, is the plain one: inverse frequencies
``1 / theta ** (2i / head_dim)`` over the whole head, no scaling. Their tables are computed here
by the same fp32 operations, without importing the family's modelling code (seconds at every
engine start); tests/unit/engine/test_rope_default.py holds them to transformers' bits."""
HEAD_DIM_DEFAULTS = {"qwen3", "qwen3_moe"}
"""Families whose config class has a ``head_dim`` default of its own when config.json names none."""
LAYER_TYPES = {"gemma3": ("full_attention", "sliding_attention")}
"""Families whose layers' rotations differ by layer type: their tables stack one per type, in this order."""


def rope_tables(model_dir: Path, architecture: str, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)``, each ``(max_len, head_dim)`` in fp32, in the half-rotation layout; for a
    family in :data:`LAYER_TYPES`, ``(types, max_len, head_dim)``, one table per layer type.

    Scaling as the config declares it (linear, llama3, yarn, longrope) is the rotary class's own.
    LongRoPE: transformers picks the short or the long factors for each forward pass from that
    pass's largest position (long past ``original_max_position_embeddings``), so in transformers
    a sequence that grows past that length keeps its earlier keys rotated with the short factors
    and rotates later ones with the long. These tables are one pass over ``max_len`` (the
    engine's ``max_model_len``) positions: the long factors everywhere when ``max_len`` exceeds
    ``original_max_position_embeddings``, the short ones otherwise. That is transformers' result
    for every prompt longer than the original length, and for every sequence when ``max_len``
    does not exceed it; a shorter prompt that generates past it differs (no mid-sequence switch).
    Dynamic NTK scaling, which transformers recomputes from each pass's length, is refused."""
    plain = plain_default_tables(model_dir, architecture, max_len)
    return plain if plain is not None else transformers_tables(model_dir, architecture, max_len)


def transformers_tables(model_dir: Path, architecture: str, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`rope_tables` from the family's own rotary class."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir).get_text_config()
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    per_type = [rope.get(t) or {} for t in LAYER_TYPES.get(architecture, ())] if isinstance(rope, dict) else []
    for params in [rope, *per_type]:
        if isinstance(params, dict) and params.get("rope_type", params.get("type")) == "dynamic":
            raise ValueError("dynamic rope scaling is not supported")
    module_name, class_name = _ROTARY_CLASSES[architecture]
    rotary = getattr(importlib.import_module(module_name), class_name)(config=config)
    positions = torch.arange(max_len).unsqueeze(0)
    probe = torch.zeros(1, dtype=torch.float32)
    with torch.no_grad():
        if architecture in LAYER_TYPES:
            tables = [rotary(probe, positions, layer_type=t) for t in LAYER_TYPES[architecture]]
            return torch.stack([c[0] for c, _ in tables]), torch.stack([s[0] for _, s in tables])
        cos, sin = rotary(probe, positions)
    return cos[0].contiguous(), sin[0].contiguous()


def plain_default_tables(model_dir: Path, architecture: str, max_len: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The tables of unscaled RoPE for a family in :data:`PLAIN_DEFAULT`, from config.json alone;
    None when the config leaves anything to the family's config class (no ``rope_theta``, a
    scaling, a partial rotation, a ``head_dim`` its class would default)."""
    if architecture not in PLAIN_DEFAULT:
        return None
    try:
        config = read_config(model_dir)
    except (OSError, ValueError):
        return None
    params = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or {}
    if not isinstance(params, dict) or not isinstance(scaling, dict):
        return None
    # Qwen2-VL's "mrope" is plain RoPE whose positions differ per frequency section (models/decoder.py)
    plain = ("default", "mrope")
    if (
        params.get("rope_type", "default") not in plain
        or scaling.get("rope_type", scaling.get("type", "default")) not in plain
    ):
        return None
    theta = params.get("rope_theta", config.get("rope_theta"))
    head_dim = config.get("head_dim")
    if architecture in HEAD_DIM_DEFAULTS and head_dim is None:
        return None
    if head_dim is None:
        head_dim = config["hidden_size"] // config["num_attention_heads"]
    if not isinstance(theta, (int, float)) or config.get("partial_rotary_factor", 1.0) != 1.0:
        return None
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
    freqs = torch.arange(max_len).float()[:, None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()
