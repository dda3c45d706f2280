"""Helpers for the server's child processes (handler workers, the engine)."""

from __future__ import annotations

import ctypes
import signal


def die_with_parent() -> None:
    """Ask Linux to kill this process when the server process dies."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _ignore(signum: int, frame: object) -> None:
    pass


def ignore_stop_signals() -> None:
    """Let the server decide when this child stops.

    A terminal's Ctrl-C, ``kill -- -PGID`` or a service manager signals the whole process group;
    the server then drains its requests, which needs its workers and engine alive, and stops them
    itself. A handler that does nothing (rather than SIG_IGN) is reset by exec, so the programs a
    handler starts still get the usual signals; system calls it interrupts are restarted.
    """
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _ignore)
        signal.siginterrupt(sig, False)


async def spawn(module: str, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    """Start ``python -m module --fd N`` with one end of a socket pair.

    Returns the process and the (reader, writer) streams of our end.
    """
    import asyncio
    import socket
    import sys

    parent, child = socket.socketpair()
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", module, "--fd", str(child.fileno()), pass_fds=(child.fileno(),), env=env
        )
    finally:
        child.close()
    reader, writer = await asyncio.open_unix_connection(sock=parent)
    return process, reader, writer


def exit_description(code: int | None) -> str:
    if code is None:
        return "for an unknown reason"
    if code < 0:
        try:
            return f"with signal {signal.Signals(-code).name}"
        except ValueError:
            return f"with signal {-code}"
    return f"with status {code}"
