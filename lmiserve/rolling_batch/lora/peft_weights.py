"""Reading a PEFT LoRA adapter: ``adapter_config.json`` and ``adapter_model.safetensors``.

The adapter may target any of the decoder's projections (``q_proj``, ``k_proj``, ``v_proj``,
``o_proj``, ``gate_proj``, ``up_proj``, ``down_proj``), in any layers, with a rank per module
(``rank_pattern``) and an alpha per module (``alpha_pattern``); its scaling, ``alpha / r`` (or
``alpha / sqrt(r)`` with ``use_rslora``), is folded into B. What the engine cannot apply is refused
with the reason: DoRA, trained biases, ``modules_to_save`` (embeddings or the LM head), other
modules, a rank above ``max_lora_rank``, shapes of another base model.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..models.spec import ModelSpec

MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_BLOCK = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn"}
VISION_PARTS = ("vision_tower.", "multi_modal_projector.", "vision_model.")
"""Where a vision-language model's tower and projector are named: LoRA weights there are refused
(their layers would otherwise read as the language model's)."""
_KEY = re.compile(r"(?:^|\.)layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.[\w-]+)?\.weight$")


class AdapterFormatError(ValueError):
    """The directory is not a LoRA adapter this engine can apply to its model."""


@dataclass
class LoraWeights:
    """One adapter's factors per layer and module: ``A`` ``(r, in)`` and ``B`` ``(out, r)``
    with the scaling folded in, in the model's dtype, on the CPU."""

    rank: int
    layers: dict[int, dict[str, tuple[torch.Tensor, torch.Tensor]]] = field(default_factory=dict)

    @property
    def modules(self) -> set[str]:
        return {m for per_layer in self.layers.values() for m in per_layer}

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes + b.nbytes for per_layer in self.layers.values() for a, b in per_layer.values())


def module_shapes(spec: ModelSpec) -> dict[str, tuple[int, int]]:
    """``(in_features, out_features)`` of each projection an adapter may target."""
    h, i = spec.hidden_size, spec.intermediate_size
    q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    return {
        "q_proj": (h, q),
        "k_proj": (h, kv),
        "v_proj": (h, kv),
        "o_proj": (q, h),
        "gate_proj": (h, i),
        "up_proj": (h, i),
        "down_proj": (i, h),
    }


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    weights = path / "adapter_model.safetensors"
    if weights.is_file():
        from safetensors.torch import load_file

        return load_file(str(weights))
    legacy = path / "adapter_model.bin"
    if legacy.is_file():
        return torch.load(str(legacy), map_location="cpu", weights_only=True)
    raise AdapterFormatError(f"{path} has no adapter_model.safetensors (nor adapter_model.bin)")


def _config(path: Path) -> dict:
    file = path / "adapter_config.json"
    if not file.is_file():
        raise AdapterFormatError(f"{path} is not a PEFT adapter directory: it has no adapter_config.json")
    try:
        config = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise AdapterFormatError(f"{file} cannot be read: {exc}") from None
    refused = []
    if str(config.get("peft_type", "LORA")).upper() != "LORA":
        refused.append(f"peft_type {config.get('peft_type')!r} (only LORA)")
    if config.get("use_dora"):
        refused.append("DoRA (use_dora)")
    if config.get("bias", "none") != "none":
        refused.append(f"trained biases (bias={config.get('bias')!r})")
    if config.get("modules_to_save"):
        refused.append(f"modules_to_save {config['modules_to_save']}")
    if config.get("fan_in_fan_out"):
        refused.append("fan_in_fan_out weights")
    if refused:
        raise AdapterFormatError(f"{path}: this engine cannot apply {', '.join(refused)}")
    return config


def _pattern(patterns: dict, module: str, default: float) -> float:
    """PEFT's per-module override: the first key that matches the end of the module's name."""
    for key, value in patterns.items():
        if re.fullmatch(rf"(.*\.)?({key})", module):
            return float(value)
    return float(default)


def read_adapter(path: str | Path, spec: ModelSpec, max_rank: int, dtype: torch.dtype) -> LoraWeights:
    """The adapter in ``path`` for a model of ``spec``; :class:`AdapterFormatError` says why not."""
    path = Path(path)
    config = _config(path)
    alpha = config.get("lora_alpha", config.get("r", 8))
    rslora = bool(config.get("use_rslora", False))
    found: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    others = []
    tensors = _tensors(path)
    tower = sorted(name for name in tensors if any(part in name for part in VISION_PARTS))
    if tower:
        raise AdapterFormatError(
            f"{path} adapts a vision tower or projector ({tower[0]}{' ...' if len(tower) > 1 else ''}); this engine "
            "adapts the language model only: train with target_modules limited to it, e.g. "
            r"'.*language_model.*\.(q_proj|v_proj)'"
        )
    for name, tensor in tensors.items():
        match = _KEY.search(name)
        if match is None or match.group(2) not in MODULES:
            others.append(name)
            continue
        found.setdefault((int(match.group(1)), match.group(2)), {})[match.group(3)] = tensor
    if others:
        raise AdapterFormatError(
            f"{path} holds weights for modules this engine does not adapt: {', '.join(sorted(others)[:3])}"
            f"{' ...' if len(others) > 3 else ''} (it adapts {', '.join(MODULES)})"
        )
    if not found:
        raise AdapterFormatError(f"{path} holds no LoRA weights")
    shapes = module_shapes(spec)
    weights = LoraWeights(rank=0)
    for (layer, module), pair in sorted(found.items()):
        where = f"layer {layer} {module}"
        if layer >= spec.num_layers:
            raise AdapterFormatError(f"{path}: {where} is beyond the model's {spec.num_layers} layers")
        if set(pair) != {"A", "B"}:
            raise AdapterFormatError(f"{path}: {where} has lora_{next(iter(pair))} without its other half")
        a, b = pair["A"], pair["B"]
        rank = a.shape[0]
        fan_in, fan_out = shapes[module]
        if a.dim() != 2 or b.dim() != 2 or a.shape[1] != fan_in or tuple(b.shape) != (fan_out, rank):
            raise AdapterFormatError(
                f"{path}: {where} has A {tuple(a.shape)} and B {tuple(b.shape)}, but this model needs "
                f"A (r, {fan_in}) and B ({fan_out}, r): the adapter was trained for another base model"
            )
        if rank > max_rank:
            raise AdapterFormatError(
                f"{path}: the adapter has rank {rank} ({where}), above option.max_lora_rank ({max_rank})"
            )
        full = f"model.layers.{layer}.{_BLOCK.get(module, 'mlp')}.{module}"
        scale = _pattern(config.get("alpha_pattern") or {}, full, alpha) / (math.sqrt(rank) if rslora else rank)
        weights.layers.setdefault(layer, {})[module] = (
            a.to(dtype).contiguous(),
            (b.float() * scale).to(dtype).contiguous(),
        )
        weights.rank = max(weights.rank, rank)
    return weights
