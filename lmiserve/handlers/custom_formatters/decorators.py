"""The decorators that mark a ``model.py`` function as a custom input or output formatter.

``@output_formatter`` (or ``@output_formatter(content_type="text/plain")``) marks a function
``f(output: TextGenerationOutput) -> str | bytes`` that formats every response of the
rolling-batch path; ``@input_formatter`` marks ``f(inputs: Input) -> TextInput | dict`` that
turns a request body into a generation request. The content type can also be set as an
attribute, ``f.content_type = "text/plain"``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

MARK = "_lmiserve_formatter"
"""The attribute a decorator sets on the function: ``"input"`` or ``"output"``."""


def _mark(kind: str, fn: Any, content_type: str | None) -> Any:
    if not callable(fn):
        raise TypeError(f"@{kind}_formatter decorates a function, not {type(fn).__name__}")
    setattr(fn, MARK, kind)
    if content_type is not None:
        fn.content_type = content_type
    return fn


def output_formatter(fn: F | None = None, *, content_type: str | None = None) -> Any:
    """Mark ``fn`` as the model's output formatter (usable with or without arguments)."""
    if fn is None:
        return lambda f: _mark("output", f, content_type)
    return _mark("output", fn, content_type)


def input_formatter(fn: F | None = None) -> Any:
    """Mark ``fn`` as the model's input formatter (usable with or without parentheses)."""
    if fn is None:
        return lambda f: _mark("input", f, None)
    return _mark("input", fn, None)


def formatter_kind(obj: Any) -> str | None:
    """``"input"``, ``"output"`` or None for an unmarked object."""
    kind = getattr(obj, MARK, None) if callable(obj) else None
    return kind if kind in ("input", "output") else None


def content_type_of(fn: Callable[..., Any]) -> str | None:
    value = getattr(fn, "content_type", None)
    return value if isinstance(value, str) and value else None
