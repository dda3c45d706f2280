"""LLaVA-NeXT's "any resolution" rules, torch-free (the API process counts a picture's tokens with
them; the engine lays its tiles out with them): the grid resolution a picture is resized and padded
to, its tiles, and how many embeddings remain once the padding is cut off again."""

from __future__ import annotations

from collections.abc import Sequence


def best_resolution(height: int, width: int, pinpoints: Sequence[Sequence[int]]) -> tuple[int, int]:
    """The ``(height, width)`` of ``pinpoints`` that keeps most of the picture's pixels, then wastes
    the fewest (transformers' ``select_best_resolution``)."""
    best = (0, 0)
    most, least_wasted = 0, float("inf")
    for h, w in pinpoints:
        scale = min(w / width, h / height)
        effective = min(int(width * scale) * int(height * scale), width * height)
        wasted = w * h - effective
        if effective > most or (effective == most and wasted < least_wasted):
            most, least_wasted, best = effective, wasted, (h, w)
    return best


def grid(height: int, width: int, pinpoints: Sequence[Sequence[int]], tile: int) -> tuple[int, int]:
    """Tiles of the picture's grid resolution, ``(rows, columns)``."""
    h, w = best_resolution(height, width, pinpoints)
    return h // tile, w // tile


def unpadded(height: int, width: int, rows: int, cols: int) -> tuple[int, int, int, int]:
    """Of a ``rows x cols`` feature map of a picture padded to its aspect: ``(top, bottom, left,
    right)`` bounds of the part that is the picture (transformers' ``unpad_image``)."""
    if width / height > cols / rows:
        new_rows = int(round(height * (cols / width), 7))
        pad = (rows - new_rows) // 2
        return pad, rows - pad, 0, cols
    new_cols = int(round(width * (rows / height), 7))
    pad = (cols - new_cols) // 2
    return 0, rows, pad, cols - pad


def feature_count(height: int, width: int, pinpoints: Sequence[Sequence[int]], tile: int, side: int, base: int) -> int:
    """Embeddings of one picture: the unpadded tiles' features with a newline embedding after each
    row, then the ``base`` features of the whole picture at tile size (``side`` features a side)."""
    rows, cols = grid(height, width, pinpoints, tile)
    top, bottom, left, right = unpadded(height, width, rows * side, cols * side)
    return (bottom - top) * (right - left + 1) + base
