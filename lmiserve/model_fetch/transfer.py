"""One file fetched over HTTP by parallel ranged GETs: resumable, verified, and given its name only
when complete.

The bytes go to ``NAME.part`` (the file's full size, written at each range's offset); each range
that is complete is recorded in ``NAME.part.ranges`` under the remote file's version (an ETag or a
hash). A download that is killed leaves both behind, and the next one fetches only the ranges not
recorded, if the version is still the same. Once every range is in, the size (and the hash where
the source gives one) is checked, and the file is renamed to ``NAME``.
"""

from __future__ import annotations

import errno
import hashlib
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

import urllib3

from .connections import Connections
from .errors import FetchError
from .progress import Progress

CHUNK_BYTES = 32 * 1024 * 1024
"""The largest ranged GET: the unit that is resumed."""
MIN_CHUNK_BYTES = 1024 * 1024
MIB = 1024 * 1024
STREAMS = 8
"""Ranged GETs in flight at once, over all the files of a model."""
ATTEMPTS = 5
BACKOFF_S = 0.5
READ_BYTES = 64 * 1024
"""One read from the socket, and one write to the file. Small on purpose: on Linux 6.18 (ext4, a
2-core VM), 1-4 MiB reads and writes cost the kernel 2-3x the CPU time of a 2 GB download (sys 3-5 s
against 0.7-1 s at 64-256 KiB; the page cache's large folios, probably)."""
RETRIED_STATUSES = {408, 425, 429, 500, 502, 503, 504}


class DiskFull(Exception):
    def __init__(self, directory: Path) -> None:
        super().__init__(str(directory))
        self.directory = directory


class HttpStatus(Exception):
    """A GET answered with a status that retrying will not change."""

    def __init__(self, status: int, url: str) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.url = url


@dataclass
class RemoteFile:
    name: str
    """Its name in the model (for messages)."""
    size: int
    version: str
    """What identifies this content at the source (an ETag, a blob id): a partial file is resumed
    only for the same version."""
    url: Callable[[], str]
    """The URL to GET; asked again after a 403 (a signed URL that expired)."""
    headers: dict[str, str] = field(default_factory=dict)
    sha256: str | None = None
    git_blob_sha1: str | None = None


def part_paths(dest: Path) -> tuple[Path, Path]:
    return dest.with_name(dest.name + ".part"), dest.with_name(dest.name + ".part.ranges")


def _resumed(record: Path, version: str) -> set[int]:
    """The ranges a killed download of the same version completed."""
    try:
        lines = record.read_text().splitlines()
    except OSError:
        return set()
    if not lines or lines[0] != f"version {version}":
        return set()
    return {int(line) for line in lines[1:] if line.isdigit()}


def chunk_bytes(size: int) -> int:
    """A file's range size: at least four ranges per stream, 1 to 32 MiB, whole MiB."""
    wanted = -(-size // (4 * STREAMS))
    return min(CHUNK_BYTES, max(MIN_CHUNK_BYTES, -(-wanted // MIB) * MIB))


def remaining_bytes(remote: RemoteFile, dest: Path) -> int:
    """What is still to fetch of ``remote`` into ``dest`` (0 when it is there)."""
    if dest.is_file() and dest.stat().st_size == remote.size:
        return 0
    done = _resumed(part_paths(dest)[1], remote.version)
    chunk = chunk_bytes(remote.size)
    return sum(min(chunk, remote.size - i * chunk) for i in range(_count(remote.size, chunk)) if i not in done)


def _count(size: int, chunk: int) -> int:
    return max(1, -(-size // chunk))


class Transfer:
    """The files of one model, fetched ``streams`` ranges at a time over one connection pool.
    Ranges are 1 to 32 MiB (:func:`chunk_bytes`), so that a small file is fetched in parallel too."""

    def __init__(self, progress: Progress, streams: int = STREAMS, deadline: float | None = None) -> None:
        self.progress = progress
        self.deadline = deadline
        self.streams = streams
        self.connections = Connections(streams)
        self._stop = threading.Event()
        self._local = threading.local()

    def fetch(self, files: list[tuple[RemoteFile, Path]]) -> None:
        """Fetch every (remote, destination) that is not already in place."""
        jobs = []
        opened: list[_OpenPart] = []
        try:
            seen: set[Path] = set()
            for remote, dest in files:
                if dest in seen or (dest.is_file() and dest.stat().st_size == remote.size):
                    continue  # in place, or the same content under two names (one blob)
                seen.add(dest)
                part = _OpenPart(remote, dest)
                opened.append(part)
                jobs += [(part, index) for index in part.todo]
            with ThreadPoolExecutor(self.streams, thread_name_prefix="download") as pool:
                futures = [pool.submit(self._range, part, index) for part, index in jobs]
                finished, _ = wait(futures, return_when=FIRST_EXCEPTION)
                failed = next((f for f in finished if f.exception() is not None), None)
                if failed is not None:
                    self._stop.set()
                    for future in futures:
                        future.cancel()
                    raise failed.exception()  # type: ignore[misc]
            for part in opened:
                if not part.todo:  # every range was there already (a download killed before the rename)
                    part.finish()
        finally:
            for part in opened:
                part.close()

    def _range(self, part: _OpenPart, index: int) -> None:
        start = index * part.chunk
        end = min(start + part.chunk, part.remote.size)
        offset, attempt, refreshed = start, 0, False
        url = part.url()
        while offset < end:
            if self._stop.is_set():
                return
            try:
                offset = self._get(part, url, offset, end)
            except HttpStatus as exc:
                if exc.status == 403 and not refreshed:  # a signed URL that expired: ask again
                    url, refreshed = part.url(refresh=True), True
                    continue
                if exc.status not in RETRIED_STATUSES or attempt + 1 >= ATTEMPTS:
                    raise
                attempt += 1
                time.sleep(BACKOFF_S * 2**attempt)
            except (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError) as exc:
                if attempt + 1 >= ATTEMPTS:
                    raise FetchError(
                        f"{part.remote.name}: the network failed {ATTEMPTS} times in a row ({type(exc).__name__}: {exc})"
                    ) from None
                attempt += 1
                time.sleep(BACKOFF_S * 2**attempt)
        if part.completed(index):
            part.finish()

    def _buffer(self) -> memoryview:
        """This thread's read buffer, made once: a new one for each GET costs page faults."""
        buffer = getattr(self._local, "buffer", None)
        if buffer is None:
            buffer = self._local.buffer = memoryview(bytearray(READ_BYTES))
        return buffer

    def _get(self, part: _OpenPart, url: str, offset: int, end: int) -> int:
        headers = dict(part.remote.headers, Range=f"bytes={offset}-{end - 1}")
        pool = self.connections.pool(url)
        response = pool.request("GET", url, headers=headers, preload_content=False, redirect=True)
        try:
            if response.status == 200 and offset == 0 and end == part.remote.size:
                pass  # a server that sends the whole file for the only range
            elif response.status != 206:
                raise HttpStatus(response.status, url)
            # straight from the socket into one buffer: urllib3's own readinto reads into a new
            # bytes object and copies it (a coded body, which model files never are, goes through it)
            raw = getattr(response, "_fp", None)
            coded = response.headers.get("Content-Encoding", "identity") != "identity"
            readinto = raw.readinto if raw is not None and not coded else response.readinto
            buffer = self._buffer()
            while offset < end:
                if self._stop.is_set():
                    return offset
                if self.deadline is not None and time.monotonic() > self.deadline:
                    raise FetchError(
                        f"{part.remote.name}: the download did not finish within model_loading_timeout; "
                        "what was fetched is kept and the next start resumes it"
                    )
                count = readinto(buffer[: min(READ_BYTES, end - offset)])
                if not count:  # the connection closed early: retried from here, as a failed attempt
                    raise ConnectionError(f"the connection closed at byte {offset} of {end}")
                part.write(buffer[:count], offset)
                offset += count
                self.progress.add(count)
        finally:
            response.release_conn()
        return offset


class _OpenPart:
    """A ``.part`` file open for writing, and its record of completed ranges."""

    def __init__(self, remote: RemoteFile, dest: Path) -> None:
        self.remote, self.dest = remote, dest
        self.chunk = chunk = chunk_bytes(remote.size)
        self.part, self.record = part_paths(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        done = _resumed(self.record, remote.version) if self.part.is_file() else set()
        self.todo = [i for i in range(_count(remote.size, chunk)) if i not in done]
        if not done:
            self.record.write_text(f"version {remote.version}\n")
        self.fd = os.open(self.part, os.O_RDWR | os.O_CREAT, 0o644)
        self.record_fd = os.open(self.record, os.O_WRONLY | os.O_APPEND)
        self._url: str | None = None
        self._lock = threading.Lock()
        self._left = len(self.todo)
        try:
            _reserve(self.fd, remote.size)
        except OSError as exc:
            self.close()
            raise _disk_error(exc, dest) from None

    def url(self, refresh: bool = False) -> str:
        with self._lock:
            if self._url is None or refresh:
                self._url = self.remote.url()
            return self._url

    def write(self, data: memoryview, offset: int) -> None:
        view = data
        while view:
            try:
                written = os.pwrite(self.fd, view, offset)
            except OSError as exc:
                raise _disk_error(exc, self.dest) from None
            view, offset = view[written:], offset + written

    def completed(self, index: int) -> bool:
        """Record a range as complete; whether it was the file's last."""
        os.write(self.record_fd, f"{index}\n".encode())
        with self._lock:
            self._left -= 1
            return self._left == 0

    def finish(self) -> None:
        """Check the file, flush it and give it its name."""
        size = os.fstat(self.fd).st_size
        if size != self.remote.size:
            raise FetchError(f"{self.remote.name}: {size} bytes written, the source says {self.remote.size}")
        if self.remote.sha256 or self.remote.git_blob_sha1:
            self._check_hash()
        # no fsync: a killed process never leaves a file under its name that is not complete (the
        # rename is atomic); a machine that loses power may, as with huggingface_hub and s5cmd.
        # Flushing 2 GB took 0.6 s, a third of the download on loopback.
        os.replace(self.part, self.dest)
        self.record.unlink(missing_ok=True)

    def _check_hash(self) -> None:
        if self.remote.sha256:
            digest, want, kind = hashlib.sha256(), self.remote.sha256, "sha256"
        else:
            digest, want, kind = hashlib.sha1(), self.remote.git_blob_sha1, "git blob sha1"
            digest.update(f"blob {self.remote.size}\0".encode())
        with open(self.part, "rb") as handle:
            while block := handle.read(8 * READ_BYTES):
                digest.update(block)
        if digest.hexdigest() != want:
            self.part.unlink(missing_ok=True)
            self.record.unlink(missing_ok=True)
            raise FetchError(
                f"{self.remote.name}: the downloaded bytes do not match the source's {kind} ({want}); "
                "the file was removed and is fetched again on the next start"
            )

    def close(self) -> None:
        for fd in (self.fd, self.record_fd):
            try:
                os.close(fd)
            except OSError:
                pass


def _reserve(fd: int, size: int) -> None:
    """The file at its full size, its blocks reserved now where the file system can (a full disk
    says so before the download, not half-way)."""
    if size > 0:
        try:
            os.posix_fallocate(fd, 0, size)
            return
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                raise
    os.ftruncate(fd, size)


def _disk_error(exc: OSError, dest: Path) -> Exception:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskFull(dest.parent)
    return exc
