"""A Hugging Face checkpoint's ``*.safetensors`` files read as they are: every tensor, or each
tensor's piece a tensor-parallel rank holds."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import safe_open

from .pieces import SKIP, Piece, take_piece


def load_state_dict(
    model_dir: Path, dtype: torch.dtype | None, device: str = "cpu", pieces: Callable[[str], Piece] | None = None
) -> dict[str, torch.Tensor]:
    """Every tensor of every ``*.safetensors`` file in ``model_dir``, floating ones cast to
    ``dtype`` (None: as stored).

    ``pieces`` names the part of each tensor to read (a tensor-parallel rank's shard); only
    that part is read from the file.
    """
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors weights in {model_dir}")
    tensors: dict[str, torch.Tensor] = {}
    for path in files:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():
                piece = None if pieces is None else pieces(name)
                if piece == SKIP:
                    continue
                t = f.get_tensor(name) if piece is None else take_piece(f.get_slice(name), piece)  # type: ignore[arg-type]
                cast = dtype is not None and t.is_floating_point()
                tensors[name] = t.to(device=device, dtype=dtype) if cast else t.to(device)
    return tensors
