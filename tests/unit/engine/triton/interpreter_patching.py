"""Triton's CPU interpreter, without its repeated set-up inside a kernel.

At a launch the interpreter swaps ``triton.language``'s builtins for its own (a walk over the
modules' members), runs the kernel, and puts them back. Each call of a ``@triton.jit`` helper
from inside the kernel (a cast, a tile product) walks the same modules and swaps the same
builtins again: a third of an interpreted engine step. Within a launch the first swap holds for
every helper, so later ones are skipped here. Outside a launch nothing changes, and where the
interpreter's internals are not as expected nothing is touched.
"""

from __future__ import annotations

import threading


def skip_nested_patches() -> bool:
    """Install the skip; False (nothing changed) when this Triton's interpreter differs."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    patch = getattr(interpreter, "_patch_lang", None)
    executor = getattr(interpreter, "GridExecutor", None)
    scope_type = getattr(interpreter, "_LangPatchScope", None)
    if patch is None or executor is None or scope_type is None or getattr(patch, "skips_nested", False):
        return False
    import triton.language as tl

    langs = (tl, tl.core)
    state = threading.local()
    launch = executor.__call__

    def launch_once(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        outer = getattr(state, "patched", None)
        state.patched = set()
        try:
            return launch(self, *args, **kwargs)
        finally:
            state.patched = outer

    def patch_once(fn):  # type: ignore[no-untyped-def]
        patched = getattr(state, "patched", None)
        if patched is None:  # outside a launch
            return patch(fn)
        # what the interpreter swaps depends on which of the language modules the function sees
        key = frozenset(id(v) for v in fn.__globals__.values() if any(v is lang for lang in langs))
        if key in patched:
            return scope_type()  # already swapped in this launch: nothing to restore
        patched.add(key)
        return patch(fn)

    patch_once.skips_nested = True  # type: ignore[attr-defined]
    executor.__call__ = launch_once
    interpreter._patch_lang = patch_once
    return True
