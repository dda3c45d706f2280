"""The pictures and videos a generation request carries to the engine (part of :mod:`.wire`'s messages)."""

from __future__ import annotations

import msgspec


class ImageInput(msgspec.Struct, kw_only=True, frozen=True):
    """One decoded picture (or a video's sampled frames) and the run of placeholder tokens its
    embeddings fill."""

    offset: int
    """Where the run starts in the prompt's token ids."""
    length: int
    """Its placeholder tokens (as many as the vision model's embeddings of the picture)."""
    digest: str
    """sha256 of the decoded pixels (a video's: and its frame rate): the encoder cache's and the
    prefix cache's key."""
    width: int
    height: int
    pixels: bytes
    """RGB, row by row, ``width * height * 3`` bytes a frame: decoded once, in the API process."""
    frames: int = 0
    """A video's sampled frames (already at the model's frame size); 0: a picture."""
    fps: float = 0.0
    """A video's sampled frames a second, which space its temporal positions."""
