"""EAGLE and EAGLE-3 heads as published: a head directory's config and tensors, read into one description.

EAGLE (``eagle``; EAGLE-1 and EAGLE-2 share it): ``fc`` (``2H -> H``, with a bias where it was
trained with one) over ``[token embedding; the target's final hidden state]``, then Llama decoder
layers (``layers.{i}.*``; layer 0 has no input norm), and the target's LM head on the last layer's
output with no norm in between. The target's embeddings stand in where the head has none.

EAGLE-3 (``eagle3``): ``fc`` (``k * H_target -> H``) over the residual streams of ``k`` target
layers concatenated (in layer order), one decoder layer (``midlayer.*``, or ``layers.0.*`` in the
speculators format) whose attention reads ``[input_layernorm(embedding); hidden_norm(h)]``
(``2H`` wide) and whose residual starts from ``h``, then its own ``norm`` and ``lm_head`` over a
draft vocabulary: draft id ``d`` is target id ``d + d2t[d]`` (``t2d`` marks the target ids the
draft vocabulary holds). Its own ``embed_tokens`` where it has them, the target's otherwise.

The config is read as vLLM reads it: the layer ids from ``eagle_aux_hidden_state_layer_ids`` (top
level or in ``eagle_config``; ``(2, N // 2, N - 3)`` of the target's ``N`` layers by default),
``norm_before_residual``, ``norm_before_fc``, ``fc_norm``, ``norm_output``, ``target_hidden_size``
and ``draft_vocab_size``; a speculators-format config (``speculators_model_type``) has its
``transformer_layer_config`` merged in.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..models.spec import UnsupportedModel
from ..quant.safetensors_weights import load_state_dict

METHODS = ("eagle", "eagle3")


@dataclass(frozen=True)
class HeadConfig:
    method: str
    """``eagle`` or ``eagle3``."""
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    target_hidden_size: int
    aux_layers: tuple[int, ...] = ()
    """The target layers (their input streams, ascending) an EAGLE-3 head's ``fc`` reads; empty: it
    reads the target's final hidden states (EAGLE, or EAGLE-3 with ``use_aux_hidden_state`` off)."""
    norm_before_residual: bool = False
    """EAGLE-3: the residual starts from ``hidden_norm(h)`` rather than ``h``."""
    norm_before_fc: bool = False
    """EAGLE-3: one RMSNorm (``input_norm``) over the concatenated streams before ``fc``."""
    fc_norm: bool = False
    """EAGLE-3: one RMSNorm per stream (``fc_norm.{i}``) before ``fc``."""
    norm_output: bool = False
    """EAGLE-3: the next step reads the normed output rather than the stream before the norm."""
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """The (merged) config.json, for the rotary tables."""


def read_config(head_dir: Path) -> dict[str, Any]:
    """config.json, a speculators-format one flattened to the layer's config plus its own fields."""
    config = json.loads((Path(head_dir) / "config.json").read_text())
    if "speculators_model_type" in config:
        kind = config["speculators_model_type"]
        if kind != "eagle3":
            raise UnsupportedModel(f"speculators head {kind!r} is not an EAGLE-3 head")
        merged = dict(config.get("transformer_layer_config") or {})
        merged["architectures"] = ["Eagle3LlamaForCausalLM"]
        merged["norm_before_residual"] = config.get("norm_before_residual", True)  # speculators' default
        for key in ("draft_vocab_size", "target_hidden_size", "norm_before_fc", "fc_norm", "norm_output"):
            if config.get(key) is not None:
                merged[key] = config[key]
        if config.get("eagle_aux_hidden_state_layer_ids"):
            merged["eagle_aux_hidden_state_layer_ids"] = config["eagle_aux_hidden_state_layer_ids"]
        return merged
    return config


def read_tensors(head_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the head (``*.safetensors``, else ``pytorch_model*.bin``), as stored, named
    without a ``model.`` prefix and with ``midlayer.`` as ``layers.0.``."""
    head_dir = Path(head_dir)
    if any(head_dir.glob("*.safetensors")):
        stored = load_state_dict(head_dir, None)
    else:
        files = sorted(head_dir.glob("pytorch_model*.bin"))
        if not files:
            raise FileNotFoundError(f"no .safetensors or pytorch_model*.bin weights in {head_dir}")
        stored = {}
        for path in files:
            stored.update(torch.load(path, map_location="cpu", weights_only=True))
    tensors = {}
    for name, t in stored.items():
        name = name.removeprefix("model.")
        if name.startswith("midlayer."):
            name = "layers.0." + name.removeprefix("midlayer.")
        tensors[name] = t
    return tensors


def detect_method(config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> str:
    """``eagle3`` for an EAGLE-3 architecture name or tensors only EAGLE-3 has, ``eagle`` otherwise."""
    if any("eagle3" in a.lower() for a in config.get("architectures") or ()):
        return "eagle3"
    if "d2t" in tensors or "layers.0.hidden_norm.weight" in tensors:
        return "eagle3"
    return "eagle"


def default_aux_layers(target_layers: int) -> tuple[int, ...]:
    """vLLM's default for a target of ``target_layers`` layers: ``(2, N // 2, N - 3)``."""
    return (2, target_layers // 2, target_layers - 3)


def _eagle3_option(config: dict[str, Any], name: str, default: Any) -> Any:
    nested = config.get("eagle_config") or {}
    return nested[name] if name in nested else config.get(name, default)


def head_config(config: dict[str, Any], method: str, target_layers: int, target_hidden: int) -> HeadConfig:
    if method not in METHODS:
        raise UnsupportedModel(f"unknown EAGLE method {method!r} (one of {', '.join(METHODS)})")
    if config.get("hidden_act", "silu") != "silu":
        raise UnsupportedModel(f"EAGLE head activation {config['hidden_act']!r} is not supported (silu only)")
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    common = dict(
        method=method,
        hidden_size=hidden,
        intermediate_size=config["intermediate_size"],
        num_layers=config.get("num_hidden_layers", 1),
        num_heads=heads,
        num_kv_heads=config.get("num_key_value_heads") or heads,
        head_dim=config.get("head_dim") or hidden // heads,
        rms_norm_eps=config.get("rms_norm_eps", 1e-6),
        target_hidden_size=config.get("target_hidden_size") or target_hidden,
        raw=config,
    )
    if method == "eagle":
        return HeadConfig(**common)  # type: ignore[arg-type]
    aux: tuple[int, ...] = ()
    if _eagle3_option(config, "use_aux_hidden_state", True):
        ids = config.get("eagle_aux_hidden_state_layer_ids") or _eagle3_option(
            config, "eagle_aux_hidden_state_layer_ids", None
        )
        aux = tuple(sorted(ids)) if ids else default_aux_layers(target_layers)
        if len(set(aux)) != len(aux) or not all(0 <= k <= target_layers for k in aux):
            raise UnsupportedModel(f"EAGLE-3 layers {aux} do not fit a target of {target_layers} layers")
    return HeadConfig(
        **common,  # type: ignore[arg-type]
        aux_layers=aux,
        norm_before_residual=bool(config.get("norm_before_residual", False)),
        norm_before_fc=bool(_eagle3_option(config, "norm_before_fc", False)),
        fc_norm=bool(config.get("fc_norm", False)),
        norm_output=bool(config.get("norm_output", False)),
    )


def load_head(
    head_dir: str | Path, target_layers: int, target_hidden: int, method: str | None = None
) -> tuple[HeadConfig, dict[str, torch.Tensor]]:
    """The head's description and its tensors (as stored, names as :func:`read_tensors` gives
    them); ``method`` (``eagle`` or ``eagle3``) where the directory does not say which it is."""
    config = read_config(Path(head_dir))
    tensors = read_tensors(Path(head_dir))
    spec = head_config(config, method or detect_method(config, tensors), target_layers, target_hidden)
    if "fc.weight" not in tensors and (spec.method == "eagle" or spec.aux_layers):
        raise UnsupportedModel(f"EAGLE head in {head_dir} has no fc.weight")
    return spec, tensors


def rope_tables(config: dict[str, Any], head_dim: int, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The head's ``(cos, sin)``, each ``(max_len, head_dim)`` in fp32 (half-rotation layout): plain
    RoPE from ``rope_theta``, or a scaling the config names through transformers' Llama rotary class."""
    params = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or {}
    kind = scaling.get("rope_type", scaling.get("type", params.get("rope_type", "default")))
    if kind == "default":
        theta = float(params.get("rope_theta", config.get("rope_theta", 10000.0)))
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        freqs = torch.arange(max_len).float()[:, None] * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()
    if kind == "dynamic":
        raise UnsupportedModel("dynamic rope scaling is not supported")
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    keys = set(LlamaConfig().to_dict()) | {"rope_scaling", "rope_parameters", "rope_theta", "head_dim"}
    llama = LlamaConfig(**{k: v for k, v in config.items() if k in keys and k != "architectures"})
    llama.head_dim = head_dim
    rotary = LlamaRotaryEmbedding(config=llama)
    with torch.no_grad():
        cos, sin = rotary(torch.zeros(1), torch.arange(max_len).unsqueeze(0))
    return cos[0].float().contiguous(), sin[0].float().contiguous()
