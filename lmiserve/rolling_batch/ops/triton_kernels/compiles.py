"""Counting Triton's compilations in this process.

A kernel specialisation compiled while requests run stalls every stream for the compile's
length, so start-up compiles them all first (:mod:`lmiserve.rolling_batch.runner.warmup`), and the
engine reports how many compiles happened after it said it was ready (0 when the warm-up
covered everything). Triton calls ``knobs.runtime.jit_post_compile_hook`` after each
compilation; :func:`install` chains a counter in front of any hook already there. The
interpreter (``TRITON_INTERPRET=1``) compiles nothing, so there the count stays 0.
"""

from __future__ import annotations

from typing import Any

_compiles = 0


def _count(*args: Any, **kwargs: Any) -> None:
    global _compiles
    _compiles += 1


def install() -> bool:
    """Count compilations from now on; False where this Triton has no such hook."""
    import triton

    runtime = getattr(getattr(triton, "knobs", None), "runtime", None)
    if runtime is None or not hasattr(runtime, "jit_post_compile_hook"):
        return False
    previous = runtime.jit_post_compile_hook
    if previous is None or getattr(previous, "counts_compiles", False):
        hook = _count
    else:

        def hook(*args: Any, **kwargs: Any) -> Any:
            _count()
            return previous(*args, **kwargs)

    hook.counts_compiles = True  # type: ignore[attr-defined]
    runtime.jit_post_compile_hook = hook
    return True


def count() -> int:
    """Compilations counted so far in this process."""
    return _compiles
