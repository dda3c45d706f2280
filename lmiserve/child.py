"""The server's child processes: engines, handler workers and tensor-parallel ranks.

One lifecycle for all of them. The parent starts a child with :func:`spawn` (a socket pair, the
engine and the handler workers) or :func:`start` (the tensor-parallel ranks, which meet over a
store), in the environment :func:`child_env` builds; it reaps with :meth:`ChildProcess.reap` or
:func:`reap_blocking` (:data:`EXIT_GRACE_S` to exit, then a kill) and names how a child ended with
:func:`exit_description`. A child calls :func:`become_child` first (it dies with its parent and
leaves stop signals to the server), and :func:`connect_to_parent` for its first message;
:func:`run_child` is a whole child's main: connect, start (a failure is reported to the parent)
and serve until the parent goes.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any


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


EXIT_GRACE_S = 5.0
"""How long a child that was asked to stop, or whose channel closed, has to exit before it is killed."""


def become_child() -> None:
    """What every child does first: die with the server, and let the server decide when it stops."""
    die_with_parent()
    ignore_stop_signals()


def connect_to_parent(argv: list[str], first: type, label: Callable[[Any], str]) -> tuple[socket.socket, Any] | None:
    """The socket to the parent (``--fd N``) and its first message, which must be a ``first``
    (None when it is something else); logging is set up at the level it names, each line
    labelled ``label(message)`` and this process's pid."""
    from . import logs, wire

    become_child()
    sock = socket.socket(fileno=int(argv[argv.index("--fd") + 1]))
    init = wire.recv(sock)
    if not isinstance(init, first):
        return None
    logs.configure(init.log_level, f"{label(init)} pid {os.getpid()}")
    return sock, init


def describe(exc: BaseException) -> str:
    """``Type: message`` of an exception (the type alone when it has no message)."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def run_child(
    argv: list[str],
    first: type,
    label: Callable[[Any], str],
    failed: type,
    start: Callable[[socket.socket, Any], Callable[[], None]],
) -> int:
    """A child's main. Connect (exit 2 when the first message is not a ``first``); ``start``
    from it, returning the serving loop (on any failure the parent gets a ``failed`` message
    with the traceback: exit 1); serve until the parent goes (exit 0)."""
    import logging

    from . import wire

    channel = connect_to_parent(argv, first, label)
    if channel is None:
        return 2
    sock, init = channel
    try:
        serve = start(sock, init)
    except BaseException as exc:  # noqa: BLE001 - any failure is reported to the server
        detail = "".join(traceback.format_exception(exc))
        logging.getLogger("lmiserve.child").error("%s failed to start:\n%s", label(init), detail)
        wire.send(sock, failed(error=describe(exc) + "\n" + detail))
        return 1
    try:
        serve()
    except (BrokenPipeError, ConnectionResetError):
        pass
    return 0


def child_env(threads: int | None = None, **extra: str) -> dict[str, str]:
    """A child's environment: this one, offline (a child reads the files the server fetched, and
    nothing else is downloaded at run time), tokenizers
    without threads of their own, ``threads`` OpenMP threads unless set, and ``extra``."""
    env = dict(os.environ)
    env["HF_HUB_OFFLINE"] = "1"
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    if threads is not None and "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = str(threads)
    env.update(extra)
    return env


def start(command: list[str]) -> subprocess.Popen[bytes]:
    """Start a child that finds its parent by other means than a socket pair (``command``'s flags)."""
    return subprocess.Popen(command)


def reap_blocking(popen: subprocess.Popen[bytes], grace: float = EXIT_GRACE_S) -> int:
    """Wait ``grace`` seconds for a child to exit, then kill it; its exit code."""
    try:
        return popen.wait(grace)
    except subprocess.TimeoutExpired:
        popen.kill()
        return popen.wait()


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

    async def reap(self, grace: float = EXIT_GRACE_S) -> int:
        """Wait ``grace`` seconds for the child to exit, then kill it; its exit code."""
        try:
            return await asyncio.wait_for(self.wait(), grace)
        except TimeoutError:
            self.kill()
            return await self.wait()

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


async def spawn(module: str, env: dict[str, str] | None = None, args: list[str] | None = None):  # type: ignore[no-untyped-def]
    """Start ``python -m module --fd N [args]`` with one end of a socket pair.

    Returns the process (:class:`ChildProcess`) and the (reader, writer) streams of our end.
    """
    parent, child = socket.socketpair()
    try:
        popen = subprocess.Popen(
            [sys.executable, "-m", module, "--fd", str(child.fileno()), *(args or [])],
            pass_fds=(child.fileno(),),
            env=env,
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
