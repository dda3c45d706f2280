"""Helpers for the server's child processes (handler workers, the engine)."""

from __future__ import annotations

import asyncio
import ctypes
import signal
import socket
import subprocess
import sys
import threading


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


class ChildProcess:
    """A child started with :class:`subprocess.Popen` and awaited from a thread of its own.

    The event loop's own spawning is not used: under uvloop it has closed file descriptors it
    did not own right after a spawn, and when the number had meanwhile been given to a newly
    accepted connection, that connection was reset. ``Popen`` closes nothing in the parent.
    The interface is the part of ``asyncio.subprocess.Process`` the server uses.
    """

    def __init__(self, popen: subprocess.Popen[bytes]):
        self._popen = popen
        loop = asyncio.get_running_loop()
        self._exited: asyncio.Future[int] = loop.create_future()

        def reap() -> None:
            code = popen.wait()
            loop.call_soon_threadsafe(lambda: self._exited.done() or self._exited.set_result(code))

        threading.Thread(target=reap, name=f"reap-{popen.pid}", daemon=True).start()

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def returncode(self) -> int | None:
        return self._exited.result() if self._exited.done() else None

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)

    def send_signal(self, sig: int) -> None:
        if not self._exited.done():
            self._popen.send_signal(sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


async def spawn(module: str, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    """Start ``python -m module --fd N`` with one end of a socket pair.

    Returns the process (:class:`ChildProcess`) and the (reader, writer) streams of our end.
    """
    parent, child = socket.socketpair()
    try:
        popen = subprocess.Popen(
            [sys.executable, "-m", module, "--fd", str(child.fileno())], pass_fds=(child.fileno(),), env=env
        )
    except BaseException:
        parent.close()
        raise
    finally:
        child.close()
    process = ChildProcess(popen)
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
