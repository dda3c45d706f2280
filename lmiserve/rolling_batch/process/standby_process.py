"""An engine process started ahead of need: it imports what an engine start imports, at low
priority, then waits for its :class:`~lmiserve.wire.InitEngine` as any engine process does.

Started as ``python -m lmiserve.rolling_batch.process.standby_process --fd N --standby ARCHITECTURE``
(:class:`.standby.Standby` does it). Every import, torch's included, runs on a thread of its own
with the lowest priority (nice is per thread on Linux), so the engine being served keeps the CPU:
importing torch at the engine's priority took two cores' worth of time slices from it for
seconds after each engine start (a 10-token prompt's first token in 60-190 ms instead of 18).
torch starts its compute threads on first use, from the thread that uses it (a thread inherits
its creator's priority): the engine's, started later from the main thread, which keeps the
normal priority. The one thread an import starts, numpy's OpenBLAS server, does no engine work.
When the first message arrives before the imports are done, they go on at the engine's priority
where the process may raise it again.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import select
import sys
import threading

IMPORT_NICENESS = 19
"""How much lower than the engine's the priority of the standby's imports is (the lowest)."""

_MODULES = (
    "torch",
    "lmiserve.rolling_batch.process.engine_process",
    "lmiserve.rolling_batch.quant.gguf_weights",
    "gguf.quants",
    "safetensors.torch",
    "transformers.models.auto.configuration_auto",
)


def modules(architecture: str) -> list[str]:
    """What an engine for ``architecture`` imports while it starts, the heaviest first."""
    from ..models.rope import _ROTARY_CLASSES

    family = _ROTARY_CLASSES.get(architecture)
    return [*_MODULES, *([family[0]] if family else [])]


def import_ahead(architecture: str) -> tuple[threading.Thread, int]:
    """Start importing an engine's modules on a thread at lower priority; the thread and its
    native id. A module that fails here is left for the engine to import (and report) itself."""
    started = threading.Event()
    native_id = 0

    def run() -> None:
        nonlocal native_id
        native_id = threading.get_native_id()
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, native_id, os.getpriority(os.PRIO_PROCESS, native_id) + IMPORT_NICENESS)
        started.set()
        for name in modules(architecture):
            try:
                importlib.import_module(name)
            except Exception as exc:  # noqa: BLE001 - the engine imports it again, and says why
                logging.getLogger("lmiserve.standby").debug("importing %s ahead failed: %s", name, exc)

    thread = threading.Thread(target=run, name="standby-imports", daemon=True)
    thread.start()
    started.wait()
    return thread, native_id


def finish_imports(thread: threading.Thread, native_id: int, priority: int) -> None:
    """Imports not done when the engine is wanted go on at the engine's ``priority`` where this
    process may raise a thread's priority again (root, CAP_SYS_NICE), else at the lower one."""
    if thread.is_alive():
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, native_id, priority)
    thread.join()


def main(argv: list[str] | None = None) -> int:
    from ...child import become_child

    argv = sys.argv[1:] if argv is None else argv
    become_child()
    priority = os.getpriority(os.PRIO_PROCESS, 0)
    thread, native_id = import_ahead(argv[argv.index("--standby") + 1])
    # the engine is wanted when the first message arrives (or the server went: the socket closed)
    select.select([int(argv[argv.index("--fd") + 1])], [], [])
    finish_imports(thread, native_id, priority)
    from .engine_process import main as engine_main

    return engine_main(argv)


if __name__ == "__main__":
    sys.exit(main())
