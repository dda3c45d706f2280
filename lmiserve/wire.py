"""Every message that crosses a process boundary, and how it is framed: small msgspec structs as
MessagePack, each frame prefixed with its length (4 bytes, big-endian). No pickle: a worker can
only ever receive these types."""

from __future__ import annotations

import asyncio
import socket
import struct

import msgspec

from .wire_media import ImageInput
from .wire_stats import EngineStats

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


# --- the rolling-batch engine process ----------------------------------------------------


class GuidedDecoding(msgspec.Struct, frozen=True):
    """Constrain the output: ``value`` is the JSON schema, regex, EBNF (a ``root`` rule), JSON list of choices or tag."""

    kind: str  # json_schema | json_object | regex | grammar | choice (exactly one of them) | structural_tag
    value: str = ""
    after: int = -1  # the constraint starts after this token (a reasoning model's end of thinking); -1: at once


class SamplingParams(msgspec.Struct, kw_only=True, omit_defaults=True, frozen=True):
    """How one request is decoded. The engine sees token ids only: stop strings live above it."""

    max_new_tokens: int = 30
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    typical_p: float = 1.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    n: int = 1
    best_of: int = 1
    stop_token_ids: list[int] = []
    ignore_eos: bool = False
    min_new_tokens: int = 0
    logprobs: int = 0
    """Alternatives reported per generated token (0: only the chosen token's log-probability)."""
    prompt_logprobs: int | None = None
    """None: no prompt log-probabilities; k >= 0: each prompt token's, plus k alternatives."""
    guided: GuidedDecoding | None = None
    num_beams: int = 1
    """Beam search with this many beams when above 1 (the best ``n`` hypotheses are returned)."""
    bad_words: list[str] = []  # texts the output never contains (TensorRT-LLM's bad_sequences, vLLM's)
    bad_word_ids: list[list[int]] = []  # bad_words as token sequences, set at admission for the engine
    length_penalty: float = 1.0
    early_stopping: bool = False
    speculate: bool = True
    """False: the engine never proposes tokens for this request (speculative decoding off for it)."""


class InitEngine(Msg):
    model_name: str
    model_path: str
    options: dict[str, str]
    log_level: str = "info"
    listen_path: str = ""  # a Unix socket path where other API processes may connect to the engine ("": none)


class EngineReady(Msg):
    info: dict[str, str | int | float]


class EngineFailed(Msg):
    error: str


class GenerateRequest(Msg):
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    adapter: str = ""
    """The LoRA adapter the request uses ("" for the base model)."""
    output_ids: list[int] = []
    """Tokens this request already generated in an engine that has since died (a replay): the engine
    continues as if it had generated them. They count towards ``max_new_tokens`` and ``min_new_tokens``,
    the penalties see them, a seeded generator is advanced past them, and only later tokens are
    emitted. One sequence only (``n``, ``best_of`` and ``num_beams`` 1)."""
    cumulative_logprob: float = 0.0
    """The log-probability of ``output_ids`` (a replay continues the sum)."""
    deadline: float = 0.0
    """``time.monotonic()`` (the host's CLOCK_MONOTONIC, the same in every process) after which the
    request is no longer worth starting: one still waiting then is never scheduled and ends with
    ``error_kind`` "deadline". 0: none."""
    images: list[ImageInput] = []  # the prompt's pictures, in prompt order


class AdapterCommand(Msg):
    """Register, update or unregister a LoRA adapter in the engine (answered by an AdapterResult)."""

    op_id: int
    action: str
    name: str
    src: str = ""
    preload: bool | None = None
    pin: bool | None = None


class AdapterResult(Msg):
    op_id: int
    kind: str | None = None
    """None: done; else why not (:class:`~lmiserve.rolling_batch.lora.adapters.AdapterError`'s
    kinds: not_found, conflict, invalid, unloadable, no_capacity, disabled, unknown_action)."""
    error: str | None = None


class AbortRequest(Msg):
    request_ids: list[str]
    index: int | None = None
    """Only this sequence of the request (best_of > 1); None: the whole request."""


class TopLogprob(msgspec.Struct, array_like=True):
    token_id: int
    logprob: float


class SeqDelta(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What happened to one sequence of a request in one engine step."""

    request_id: str
    index: int = 0
    token_ids: list[int] = []
    logprobs: list[float] = []
    top_logprobs: list[list[TopLogprob]] | None = None
    finish_reason: str | None = None
    cumulative_logprob: float = 0.0
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    prompt_logprobs: list[float | None] | None = None
    prompt_top_logprobs: list[list[TopLogprob]] | None = None
    error: str | None = None
    error_kind: str = ""
    """"validation" when the request itself was refused; "deadline" when its deadline passed while it
    waited; "oom" when memory ran out in its step; "nonfinite" when the model gave NaN or inf logits
    for it; otherwise an internal failure."""
    batch_size: int = 0
    """Sequences in the engine step that produced these tokens (0: the engine does not say)."""
    queue_us: int = 0
    """Microseconds the sequence waited for that step since its previous step (or its arrival)."""


class EngineStep(Msg):
    deltas: list[SeqDelta]
    stats: EngineStats | None = None


Message = (
    InitWorker
    | WorkerReady
    | WorkerFailed
    | Job
    | ResponseHead
    | ResponseChunk
    | ResponseEnd
    | JobDone
    | Shutdown
    | InitEngine
    | EngineReady
    | EngineFailed
    | GenerateRequest
    | AbortRequest
    | EngineStep
    | AdapterCommand
    | AdapterResult
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


def frame(msg: Msg) -> bytes:
    """``msg`` as it goes on the wire: its length, then its encoding."""
    payload = encode(msg)
    return _HEADER.pack(len(payload)) + payload


def send(sock: socket.socket, msg: Msg) -> None:
    sock.sendall(frame(msg))


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
    # one write, so one send: the reader is woken once, with the whole message
    writer.write(frame(msg))


async def read(reader: asyncio.StreamReader) -> Message | None:
    try:
        header = await reader.readexactly(_HEADER.size)
        (size,) = _HEADER.unpack(header)
        payload = await reader.readexactly(size)
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    return decode(payload)
