"""Finding a model's custom input and output formatters.

They are functions in the model directory's ``model.py`` marked ``@input_formatter`` /
``@output_formatter``, or the function ``option.output_formatter`` names (a function of
``model.py`` or a dotted path ``package.module.function``). A ``model.py`` that defines only
formatters, and no handler, keeps the rolling-batch engine.
"""

from __future__ import annotations

import ast
import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..loader import USER_MODULE, HandlerLoadError, _import_file
from .decorators import content_type_of, formatter_kind

BUILTIN_FORMATS = ("json", "jsonlines", "sse")
HANDLER_FUNCTIONS = ("model_fn", "input_fn", "predict_fn", "output_fn", "transform_fn")
"""Functions that make a ``model.py`` a handler (besides ``handle`` or ``option.handler``)."""
DECORATORS = ("output_formatter", "input_formatter")


@dataclass
class CustomFormatters:
    input: Callable[..., Any] | None = None
    output: Callable[..., Any] | None = None

    @property
    def output_content_type(self) -> str | None:
        return content_type_of(self.output) if self.output is not None else None

    def __bool__(self) -> bool:
        return self.input is not None or self.output is not None


def _decorator_name(node: ast.expr) -> str:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _top_level(tree: ast.Module) -> tuple[set[str], bool]:
    """Names the module defines at top level, and whether it decorates a function as a formatter."""
    names: set[str] = set()
    decorated = False
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            decorated = decorated or any(_decorator_name(d) in DECORATORS for d in node.decorator_list)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names, decorated


def formatters_only(model_dir: Path, handler: str, output_formatter: str) -> bool:
    """True when ``model.py`` defines formatters but no handler: the engine serves the model."""
    path = model_dir / USER_MODULE
    try:
        tree = ast.parse(path.read_bytes(), str(path))
    except (OSError, SyntaxError):
        return False
    names, decorated = _top_level(tree)
    if handler in names or any(n in names for n in HANDLER_FUNCTIONS):
        return False
    return decorated or (output_formatter not in BUILTIN_FORMATS and output_formatter in names)


def _named(model_dir: Path, module: Any, name: str) -> Callable[..., Any]:
    if "." not in name:
        fn = getattr(module, name, None) if module is not None else None
        if not callable(fn):
            raise HandlerLoadError(f"option.output_formatter={name}: no such function in {model_dir / USER_MODULE}")
        return fn
    module_name, _, attr = name.rpartition(".")
    if str(model_dir) not in sys.path:
        sys.path.insert(0, str(model_dir))
    try:
        fn = getattr(importlib.import_module(module_name), attr, None)
    except ImportError as exc:
        raise HandlerLoadError(f"option.output_formatter={name}: cannot import {module_name}: {exc}") from None
    if not callable(fn):
        raise HandlerLoadError(f"option.output_formatter={name}: {module_name} has no function {attr!r}")
    return fn


def _marked(module: Any, kind: str) -> Callable[..., Any] | None:
    found = [v for v in vars(module).values() if formatter_kind(v) == kind]
    unique = list({id(f): f for f in found}.values())
    if len(unique) > 1:
        names = ", ".join(sorted(getattr(f, "__name__", "?") for f in unique))
        raise HandlerLoadError(f"model.py marks more than one @{kind}_formatter: {names}")
    return unique[0] if unique else None


def load_custom_formatters(model_dir: Path, output_formatter: str) -> CustomFormatters:
    """The model's custom formatters (none when there is neither a marked function nor a named one).

    Errors raised by the user's module while it is imported propagate unchanged."""
    path = model_dir / USER_MODULE
    module = _import_file(path) if path.is_file() else None
    found = CustomFormatters()
    if module is not None:
        found.input = _marked(module, "input")
        found.output = _marked(module, "output")
    if output_formatter not in BUILTIN_FORMATS:
        found.output = _named(model_dir, module, output_formatter)
    return found
