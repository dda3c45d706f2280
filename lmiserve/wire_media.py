"""The pictures a generation request carries to the engine (part of :mod:`.wire`'s messages)."""

from __future__ import annotations

import msgspec


class ImageInput(msgspec.Struct, kw_only=True, frozen=True):
    """One decoded picture and the run of placeholder tokens its embeddings fill."""

    offset: int
    """Where the run starts in the prompt's token ids."""
    length: int
    """Its placeholder tokens (as many as the vision model's embeddings of the picture)."""
    digest: str
    """sha256 of the decoded pixels: the encoder cache's and the prefix cache's key."""
    width: int
    height: int
    pixels: bytes
    """RGB, row by row, ``width * height * 3`` bytes: decoded once, in the API process."""
