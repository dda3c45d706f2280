"""Media from the server's own files: only under ``allowed_local_media_path``.

A path is taken relative to that directory unless absolute; it is resolved with every symbolic link
followed (``..`` included) before the check, so a link or a ``..`` that leads out is refused. The
size is checked on the open file before reading, and reading stops one byte past the limit in case
the file grew. A FIFO or device is refused without blocking on it."""

from __future__ import annotations

import asyncio
import os
import stat

from lmiserve.media.errors import local_path, too_large
from lmiserve.media.policy import MediaPolicy
from lmiserve.media.refs import MediaRef

_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


async def read_local(path: str, ref: MediaRef, policy: MediaPolicy) -> bytes:
    if policy.allowed_local_path is None:
        raise local_path(ref.where, path, "refused: local files are not allowed (option.allowed_local_media_path)")
    return await asyncio.to_thread(_read, path, policy.allowed_local_path, ref, policy.max_bytes(ref.kind))


def inside(path: str, root: str) -> str | None:
    """The real path of ``path`` (relative to ``root`` unless absolute) if it is inside ``root``'s."""
    real_root = os.path.realpath(root)
    real = os.path.realpath(os.path.join(real_root, path))
    return real if os.path.commonpath([real_root, real]) == real_root else None


def _read(path: str, root: str, ref: MediaRef, limit: int) -> bytes:
    if "\0" in path:
        raise local_path(ref.where, path, "refused: not a valid path")
    real = inside(path, root)
    if real is None:
        raise local_path(ref.where, path, "refused: outside option.allowed_local_media_path")
    try:
        fd = os.open(real, _FLAGS)
    except FileNotFoundError:
        raise local_path(ref.where, path, "not found") from None
    except OSError as e:
        raise local_path(ref.where, path, f"cannot be read ({e.strerror or e})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise local_path(ref.where, path, "is not a regular file")
        if info.st_size > limit:
            raise too_large(ref.where, ref.kind, limit)
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise too_large(ref.where, ref.kind, limit)
    return data
