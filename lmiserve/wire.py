"""Every message that crosses a process boundary, and how it is framed.

Messages are small msgspec structs encoded as MessagePack, each frame prefixed with its
length (4 bytes, big-endian). No pickle: a worker can only ever receive these types.
"""

from __future__ import annotations

import asyncio
import socket
import struct

import msgspec

_HEADER = struct.Struct(">I")
MAX_FRAME = 2**31


class Msg(msgspec.Struct, tag=True, kw_only=True, omit_defaults=True):
    pass


# --- handler workers (dynamic batching, user model.py) -------------------------------


class InitWorker(Msg):
    model_name: str
    model_dir: str
    properties: dict[str, str]
    entry_point: str | None
    handler: str
    worker_id: int
    log_level: str = "info"


class WorkerReady(Msg):
    pid: int


class WorkerFailed(Msg):
    error: str


class JobItem(msgspec.Struct, kw_only=True, omit_defaults=True):
    request_id: str
    properties: dict[str, str]
    body: bytes


class Job(Msg):
    job_id: int
    items: list[JobItem]


class ResponseHead(Msg):
    request_id: str
    code: int
    message: str = "OK"
    headers: dict[str, str] = {}
    body: bytes = b""
    streaming: bool = False


class ResponseChunk(Msg):
    request_id: str
    data: bytes


class ResponseEnd(Msg):
    request_id: str
    error: str | None = None


class JobDone(Msg):
    job_id: int


class Shutdown(Msg):
    pass


Message = (
    InitWorker | WorkerReady | WorkerFailed | Job | ResponseHead | ResponseChunk | ResponseEnd | JobDone | Shutdown
)

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)


def encode(msg: Msg) -> bytes:
    return _encoder.encode(msg)


def decode(data: bytes) -> Message:
    return _decoder.decode(data)


# --- blocking side (worker processes) -------------------------------------------------


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        count = sock.recv_into(view[got:], n - got)
        if count == 0:
            return None
        got += count
    return bytes(buf)


def send(sock: socket.socket, msg: Msg) -> None:
    payload = encode(msg)
    header = _HEADER.pack(len(payload))
    if len(payload) < 65536:
        sock.sendall(header + payload)
    else:  # avoid copying a large body just to prepend four bytes
        sock.sendall(header)
        sock.sendall(payload)


def recv(sock: socket.socket) -> Message | None:
    """The next message, or None when the peer closed the connection."""
    header = _recv_exact(sock, _HEADER.size)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    payload = _recv_exact(sock, size)
    if payload is None:
        return None
    return decode(payload)


# --- asyncio side (the API process) ----------------------------------------------------


def write(writer: asyncio.StreamWriter, msg: Msg) -> None:
    payload = encode(msg)
    writer.write(_HEADER.pack(len(payload)))
    writer.write(payload)


async def read(reader: asyncio.StreamReader) -> Message | None:
    try:
        header = await reader.readexactly(_HEADER.size)
        (size,) = _HEADER.unpack(header)
        payload = await reader.readexactly(size)
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    return decode(payload)
