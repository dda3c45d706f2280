"""Which part of a checkpoint tensor a process loads (torch-free: the API process reads the
sharding rules that use these)."""

from __future__ import annotations

from typing import Any

SKIP = "skip"
Piece = tuple[int, int, int] | str | None
"""Which part of a tensor to load: None (all of it), SKIP (none), or ``(dim, start, stop)``."""


def take_piece(tensor: Any, piece: tuple[int, int, int]) -> Any:
    """Rows (dim 0) or columns (dim 1) ``start:stop`` of a tensor or a safetensors slice."""
    dim, start, stop = piece
    return tensor[start:stop] if dim == 0 else tensor[:, start:stop]
