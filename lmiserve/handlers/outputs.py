"""``Output``: what a handler returns, with the method names DJL code uses, and how a
batched output is split back into one response per request."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..formatters import json_wire

JSON = "application/json"
JSONLINES = "application/jsonlines"

StreamFormatter = Callable[[Any], "bytes | str | None"]


def _json(value: Any) -> bytes:
    """A handler's value as JSON, one line for every line reader (:mod:`..formatters.json_wire`)."""
    return json_wire.one_line(json.dumps(value, ensure_ascii=False).encode("utf-8"))


def default_stream_formatter(item: Any) -> bytes | None:
    """Bytes and text pass through; anything else becomes one JSON line. None sends nothing."""
    if item is None:
        return None
    if isinstance(item, (bytes, bytearray, memoryview)):
        return bytes(item)
    if isinstance(item, str):
        return item.encode("utf-8")
    return _json(item) + b"\n"


def _to_bytes(value: Any) -> tuple[bytes, str]:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value), "application/octet-stream"
    if isinstance(value, str):
        return value.encode("utf-8"), "text/plain; charset=utf-8"
    return _json(value), JSON


@dataclass
class _Slot:
    """Everything added for one batch index (or for the whole output when index is None)."""

    parts: list[tuple[str | None, bytes]] = field(default_factory=list)
    content_type: str | None = None
    properties: dict[str, str] = field(default_factory=dict)
    code: int | None = None
    message: str | None = None
    stream: Iterable[Any] | None = None
    formatter: StreamFormatter | None = None


class Output:
    """A handler's answer. For a dynamic batch, pass ``batch_index`` to say which request
    each piece belongs to."""

    def __init__(self, code: int = 200, message: str = "OK"):
        self.code = code
        self.message = message
        self._slots: dict[int | None, _Slot] = {}

    def _slot(self, batch_index: int | None) -> _Slot:
        return self._slots.setdefault(batch_index, _Slot())

    def set_code(self, code: int) -> Output:
        self.code = code
        return self

    def set_message(self, message: str) -> Output:
        self.message = message
        return self

    def add_property(self, key: str, value: str, batch_index: int | None = None) -> Output:
        self._slot(batch_index).properties[key] = str(value)
        return self

    def get_properties(self, batch_index: int | None = None) -> dict[str, str]:
        return dict(self._slot(batch_index).properties)

    def add(self, value: Any, key: str | None = None, batch_index: int | None = None) -> Output:
        data, content_type = _to_bytes(value)
        slot = self._slot(batch_index)
        slot.parts.append((key, data))
        slot.content_type = slot.content_type or content_type
        return self

    def add_as_json(self, value: Any, key: str | None = None, batch_index: int | None = None) -> Output:
        slot = self._slot(batch_index)
        slot.parts.append((key, _json(value)))
        slot.content_type = JSON
        return self

    def add_stream_content(
        self,
        stream: Iterable[Any],
        output_formatter: StreamFormatter | None = None,
        batch_index: int | None = None,
    ) -> Output:
        """Stream the items of ``stream`` to the client as they are produced.

        Each item goes through ``output_formatter`` (default: bytes and text as they are,
        anything else as a JSON line). A stream added without ``batch_index`` to a batched
        call yields, per step, a sequence with one item per request (None: nothing).
        """
        slot = self._slot(batch_index)
        slot.stream = stream
        slot.formatter = output_formatter
        return self

    def error(
        self,
        error: str,
        code: int = 424,
        message: str = "invoke handler failure",
        key: str | None = None,
        batch_index: int | None = None,
    ) -> Output:
        """Answer with an error body ``{"code", "message", "error"}`` and that status code."""
        slot = self._slot(batch_index)
        if batch_index is None:
            self.code, self.message = code, message
        else:
            slot.code, slot.message = code, message
        slot.parts = [(key, json.dumps({"code": code, "message": message, "error": error}).encode("utf-8"))]
        slot.content_type = JSON
        slot.stream = None
        return self

    def __repr__(self) -> str:
        return f"Output(code={self.code}, slots={sorted(self._slots, key=lambda k: -1 if k is None else k)})"


@dataclass
class Response:
    """One request's share of an Output."""

    code: int
    message: str
    headers: dict[str, str]
    body: bytes = b""
    stream: Iterator[bytes] | None = None


class BatchMismatch(ValueError):
    pass


def _headers(slot_props: list[dict[str, str]], content_type: str | None) -> dict[str, str]:
    headers: dict[str, str] = {}
    for props in slot_props:
        headers.update(props)
    if content_type and not any(k.lower() == "content-type" for k in headers):
        headers["Content-Type"] = content_type
    return headers


def _formatted(stream: Iterable[Any], formatter: StreamFormatter | None) -> Iterator[bytes]:
    fmt = formatter or default_stream_formatter
    for item in stream:
        out = fmt(item)
        if out is None:
            continue
        data = out.encode("utf-8") if isinstance(out, str) else bytes(out)
        if data:
            yield data


class _Fanout:
    """Splits a stream of per-step sequences (one item per request) into per-request streams.

    Consumers are pulled round-robin by the worker; whichever needs the next step pulls it
    from the shared source and buffers the other requests' items.
    """

    def __init__(self, source: Iterable[Any], n: int):
        self._source = iter(source)
        self._buffers: list[list[Any]] = [[] for _ in range(n)]
        self._done = False
        self._error: BaseException | None = None
        self._n = n

    def _pull(self) -> None:
        if self._error is not None:
            raise self._error
        try:
            step = next(self._source)
        except StopIteration:
            raise
        except Exception as exc:  # every request of the batch sees the failure
            self._error = exc
            raise
        if not isinstance(step, (list, tuple)) or len(step) != self._n:
            raise BatchMismatch(
                f"a batched stream must yield a list of {self._n} items per step (one per request), got {step!r}"
            )
        for buf, item in zip(self._buffers, step):
            if item is not None:
                buf.append(item)

    def view(self, index: int) -> Iterator[Any]:
        buf = self._buffers[index]
        while True:
            while not buf:
                if self._done:
                    return
                try:
                    self._pull()
                except StopIteration:
                    self._done = True
            yield buf.pop(0)


def fan_out(source: Iterable[Any], n: int) -> list[Iterator[Any]]:
    """Split a stream that yields, per step, a list of ``n`` items (None: nothing for that
    one) into ``n`` streams, e.g. one per request of a dynamic batch."""
    fanout = _Fanout(source, n)
    return [fanout.view(i) for i in range(n)]


def split_output(output: Output, batch_size: int) -> list[Response]:
    """One Response per request of a (possibly batched) handler call.

    Raises BatchMismatch when a batched call's output cannot be attributed to its requests.
    """
    whole = output._slots.get(None, _Slot())
    batched = batch_size > 1
    fanout = None
    if batched and whole.stream is not None:
        fanout = _Fanout(whole.stream, batch_size)
    elif batched and whole.parts and not any(i is not None for i in output._slots) and output.code < 400:
        raise BatchMismatch(
            f"the handler answered a batch of {batch_size} requests with a single output; "
            "use outputs.add(..., batch_index=i) (or add_as_json) for each request"
        )
    responses = []
    for index in range(batch_size):
        slot = output._slots.get(index, _Slot())
        code = slot.code if slot.code is not None else output.code
        message = slot.message if slot.message is not None else output.message
        if batched:
            parts = slot.parts or (whole.parts if output.code >= 400 and slot.code is None else [])
        else:
            parts = whole.parts + slot.parts
        stream_src = slot.stream if slot.stream is not None else (None if batched else whole.stream)
        formatter = slot.formatter or whole.formatter
        stream = None
        content_type = slot.content_type or whole.content_type
        if stream_src is not None:
            stream = _formatted(stream_src, formatter)
        elif fanout is not None and not slot.parts:
            stream = _formatted(fanout.view(index), formatter)
        if code >= 400:
            stream = None
        if stream is not None:
            content_type = slot.content_type or whole.content_type or JSONLINES
            parts = []
        headers = _headers([whole.properties, slot.properties], content_type)
        body = b"".join(data for _, data in parts)
        responses.append(Response(code=code, message=message, headers=headers, body=body, stream=stream))
    return responses
