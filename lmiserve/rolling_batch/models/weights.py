"""Reading Hugging Face safetensors weights."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open


def load_state_dict(model_dir: Path, dtype: torch.dtype, device: str = "cpu") -> dict[str, torch.Tensor]:
    """Every tensor of every ``*.safetensors`` file in ``model_dir``, cast to ``dtype``."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors weights in {model_dir}")
    tensors: dict[str, torch.Tensor] = {}
    for path in files:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():
                t = f.get_tensor(name)
                tensors[name] = t.to(device=device, dtype=dtype) if t.is_floating_point() else t.to(device)
    return tensors


def take(tensors: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    for candidate in (name, f"model.{name}"):
        if candidate in tensors:
            return tensors[candidate]
    raise KeyError(f"weight {name!r} not found")


def maybe(tensors: dict[str, torch.Tensor], name: str) -> torch.Tensor | None:
    try:
        return take(tensors, name)
    except KeyError:
        return None
