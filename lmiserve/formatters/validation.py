"""Turning pydantic validation errors into one clear sentence."""

from __future__ import annotations

from pydantic import ValidationError


def describe(err: ValidationError, prefix: str = "") -> str:
    parts = []
    for e in err.errors()[:3]:
        loc = ".".join(str(p) for p in e.get("loc", ()))
        loc = f"{prefix}{loc}" if loc else prefix.rstrip(".") or "body"
        msg = str(e.get("msg", "invalid")).removeprefix("Value error, ")
        value = e.get("input")
        shown = "" if isinstance(value, (dict, list)) or e.get("type") == "missing" else f" (got {value!r})"
        parts.append(f"{loc}: {msg}{shown}")
    return "; ".join(parts)
