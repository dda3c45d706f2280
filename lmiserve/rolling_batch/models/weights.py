"""A checkpoint's tensors looked up by their Hugging Face names, with or without the ``model.``
prefix."""

from __future__ import annotations

import torch


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
