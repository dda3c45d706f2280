"""Finding and importing a model's handler function, the DJL way.

``option.entryPoint`` names a ``.py`` file (relative to the model directory) or a dotted
module; without it, ``model.py`` in the model directory; without that, the built-in handler
chosen for the model. The function is ``handle`` unless ``option.handler`` says otherwise.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

USER_MODULE = "model.py"
USER_MODULES = (USER_MODULE, "inference.py", "code/inference.py")
"""Where a model's own handler is looked for, in order (``inference.py`` is the SageMaker name)."""


class HandlerLoadError(Exception):
    """The handler could not be imported or has no such function."""


def is_file_entry(entry_point: str) -> bool:
    return entry_point.endswith(".py") or "/" in entry_point or "\\" in entry_point


def resolve_entry_point(model_dir: Path, entry_point: str | None, builtin: str) -> str:
    """The entry point actually used: the configured one, else ``model.py`` (or
    ``inference.py``), else ``builtin``."""
    if entry_point:
        return entry_point
    return user_module(model_dir) or builtin


def user_module(model_dir: Path) -> str | None:
    """The model directory's own handler file, if it has one."""
    return next((name for name in USER_MODULES if (model_dir / name).is_file()), None)


def entry_file(model_dir: Path, entry_point: str) -> Path | None:
    if not is_file_entry(entry_point):
        return None
    path = Path(entry_point)
    return path if path.is_absolute() else model_dir / path


def check_syntax(model_dir: Path, entry_point: str) -> None:
    """Compile a file entry point without running it, so a syntax error stops start-up at once."""
    path = entry_file(model_dir, entry_point)
    if path is None:
        return
    if not path.is_file():
        raise HandlerLoadError(f"entry point {entry_point!r} not found in {model_dir}")
    try:
        compile(path.read_bytes(), str(path), "exec")
    except SyntaxError as exc:
        raise HandlerLoadError(
            f"syntax error in {path}, line {exc.lineno}: {exc.msg}: {(exc.text or '').strip()}"
        ) from None


def _import_file(path: Path) -> Any:
    directory = str(path.parent.resolve())
    if directory not in sys.path:
        sys.path.insert(0, directory)
    name = "lmiserve_user_" + path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise HandlerLoadError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_handler(model_dir: Path, entry_point: str, function: str = "handle") -> Callable[..., Any]:
    """Import the entry point and return its handler function.

    Errors raised while importing the user's module propagate unchanged (with their
    traceback) so that the start-up failure names the real cause.
    """
    path = entry_file(model_dir, entry_point)
    if path is not None:
        if not path.is_file():
            raise HandlerLoadError(f"entry point {entry_point!r} not found in {model_dir}")
        module = _import_file(path)
        where = str(path)
    else:
        if str(model_dir) not in sys.path:
            sys.path.insert(0, str(model_dir))
        module = importlib.import_module(entry_point)
        where = entry_point
    fn = getattr(module, function, None)
    if fn is None and function == "handle":
        from .sagemaker import handler_for, is_sagemaker_module

        if is_sagemaker_module(module):
            return handler_for(module)
    if not callable(fn):
        raise HandlerLoadError(f"{where} has no function {function!r}")
    return fn
