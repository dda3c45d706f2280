"""The one error of this package: a media part that cannot be used, as a 400 whose message starts
with the part's place in the request (``messages[0].content[1]: not an image (...)``).

``reason`` is a short, stable code for the cause (for logs and metrics); the message is for people.
The constructors below keep the wording of each cause in one place."""

from __future__ import annotations

from lmiserve.errors import BadRequest

NOUNS = {"image": "image", "video": "video", "audio": "audio file"}
PLURALS = {"image": "images", "video": "videos", "audio": "audio files"}


class MediaError(BadRequest):
    def __init__(self, where: str, message: str, *, reason: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where
        self.reason = reason
        """One of ``not_media``, ``too_large``, ``too_many``, ``unreachable``, ``disallowed``,
        ``local_path``, ``bad_encoding``."""


def size_text(n: int) -> str:
    """``20 MiB``, ``512 KiB``, ``1000 bytes``."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} bytes"


def not_media(where: str, what: str, why: str = "") -> MediaError:
    """``what``: e.g. ``an image`` or ``an MP4, AVI or WMV video``."""
    return MediaError(where, f"not {what}" + (f" ({why})" if why else ""), reason="not_media")


def too_large(where: str, kind: str, limit: int) -> MediaError:
    return MediaError(where, f"{NOUNS[kind]} larger than {size_text(limit)}", reason="too_large")


def too_many_pixels(where: str, why: str) -> MediaError:
    return MediaError(where, f"image too large ({why})", reason="too_large")


def too_many(where: str, why: str) -> MediaError:
    return MediaError(where, f"too many media parts ({why})", reason="too_many")


def unreachable(where: str, url: str, why: str) -> MediaError:
    return MediaError(where, f"cannot fetch {url} ({why})", reason="unreachable")


def disallowed(where: str, url: str, why: str) -> MediaError:
    return MediaError(where, f"URL not allowed: {url} ({why})", reason="disallowed")


def local_path(where: str, path: str, why: str) -> MediaError:
    """``why``: e.g. ``not found`` or ``refused: outside allowed_local_media_path``."""
    return MediaError(where, f"local file {shown(path)!r} {why}", reason="local_path")


def bad_encoding(where: str, why: str) -> MediaError:
    return MediaError(where, why, reason="bad_encoding")


def shown(text: str, limit: int = 120) -> str:
    """Client text as it goes into a message: at most ``limit`` characters."""
    return text if len(text) <= limit else text[: limit - 3] + "..."
