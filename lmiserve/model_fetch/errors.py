"""What fails while fetching a model, said so that a user knows what to set."""

from __future__ import annotations


class FetchError(Exception):
    """A model (or adapter) could not be fetched. The message names the model id and the cause,
    never a token or another secret, and says what to set."""


def human_bytes(count: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(count) < 1000 or unit == "TB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    return f"{count:.1f} TB"  # not reached
