"""A media part of a request, as the request names it: what kind, where it comes from, and where in
the request it was (for error messages)."""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("image", "video", "audio")


@dataclass(frozen=True)
class MediaRef:
    kind: str
    """``"image"``, ``"video"`` or ``"audio"``."""
    source: str
    """As the client sent it: a data URL, an http(s) URL, a ``file://`` URL, a server-local path or
    bare base64 (see :func:`lmiserve.media.sources.classify`)."""
    where: str
    """Where the part is in the request, e.g. ``messages[0].content[1]`` or ``inputs[2]``; errors
    start with it."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"media kind must be one of {', '.join(KINDS)}, not {self.kind!r}")
