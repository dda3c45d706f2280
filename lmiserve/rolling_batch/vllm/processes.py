"""vLLM's own processes (its engine core and workers, which name themselves ``VLLM::...``), so that
none outlives the engine: a server stopped while vLLM was still starting, or an engine that died
with workers left, would otherwise leave them running."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger("lmiserve.vllm")

TITLE = "VLLM"


def _descendants() -> list:
    try:
        import psutil
    except ImportError:  # vLLM depends on psutil; without it there is nothing to look at
        return []
    try:
        return psutil.Process().children(recursive=True)
    except psutil.Error:
        return []


def child_pids() -> frozenset[int]:
    """This process's descendants now."""
    return frozenset(p.pid for p in _descendants())


def reap(before: frozenset[int], grace: float) -> int:
    """Terminate vLLM's processes that appeared since ``before`` and still run; kill those alive
    after ``grace`` seconds. Returns how many there were."""
    import psutil

    left = []
    for proc in _descendants():
        try:
            if proc.pid not in before and proc.name().startswith(TITLE):
                left.append(proc)
        except psutil.Error:
            continue
    if not left:
        return 0
    log.warning("stopping %d vLLM process(es) left running: %s", len(left), ", ".join(str(p.pid) for p in left))
    for proc in left:
        try:
            proc.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(left, timeout=grace)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace)
    return len(left)


async def shut_down(engine: Any, children_before: frozenset[int] | None, timeout: float, grace: float) -> None:
    """Stop vLLM's engine (within ``timeout``), then reap whatever of its processes is left."""
    shutdown = getattr(engine, "shutdown", None) or getattr(engine, "shutdown_background_loop", None)
    if shutdown is not None:
        try:
            await asyncio.wait_for(asyncio.to_thread(shutdown), timeout)
        except Exception as exc:  # noqa: BLE001 - the engine is going away either way
            log.warning("vLLM did not shut down cleanly: %s", exc)
    if children_before is not None:  # vLLM was started (or was starting)
        await asyncio.to_thread(reap, children_before, grace)
