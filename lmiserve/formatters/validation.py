"""Turning pydantic validation errors into one clear sentence, and what the request models share."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from ..errors import ValidationFailed

M = TypeVar("M", bound=BaseModel)


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


def validated(model: type[M], data: Any, prefix: str = "") -> M:
    """``data`` as ``model``; :class:`ValidationFailed`, in one sentence, when it does not fit
    (``prefix`` is put before each field's name)."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise ValidationFailed(describe(err, prefix)) from None


def without_nulls(data: Any) -> Any:
    """A body's fields with ``null`` values left out (as if not sent), and a lone ``stop``
    string as a list of one; for a ``mode="before"`` model validator."""
    if isinstance(data, dict):
        data = {k: v for k, v in data.items() if v is not None}
        if isinstance(data.get("stop"), str):
            data["stop"] = [data["stop"]]
    return data


def non_empty(value: Any, message: str, most: int | None = None) -> Any:
    """``value`` unless it is an empty list (``message``) or a list longer than ``most``."""
    if isinstance(value, list) and not value:
        raise ValueError(message)
    if most is not None and isinstance(value, list) and len(value) > most:
        raise ValueError(f"at most {most} inputs per request")
    return value
