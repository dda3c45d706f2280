"""Call an endpoint: InvokeEndpoint, or InvokeEndpointWithResponseStream printed line by line."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from .response_stream import payload_parts
from .stream_lines import LineAssembler

STREAM_OPERATION = "InvokeEndpointWithResponseStream"


@dataclass
class Request:
    endpoint: str
    body: bytes
    content_type: str = "application/json"
    accept: str | None = None
    custom_attributes: str | None = None
    target_variant: str | None = None

    def params(self) -> dict:
        params: dict[str, Any] = {"EndpointName": self.endpoint, "Body": self.body, "ContentType": self.content_type}
        optional = {
            "Accept": self.accept,
            "CustomAttributes": self.custom_attributes,
            "TargetVariant": self.target_variant,
        }
        params.update({k: v for k, v in optional.items() if v})
        return params


def invoke(runtime: Any, request: Request) -> dict:
    """InvokeEndpoint; the answer's Body read into bytes."""
    answer = runtime.invoke_endpoint(**request.params())
    answer["Body"] = answer["Body"].read()
    return answer


def invoke_stream(runtime: Any, request: Request) -> tuple[dict, Iterator[bytes]]:
    """InvokeEndpointWithResponseStream: the answer's headers, and the raw event-stream body in chunks.

    botocore's parsed events drop a ModelStreamError's ErrorCode, so the raw body is taken from the
    HTTP response (through botocore's after-call event) and decoded by ``payload_parts``.
    """
    captured: dict[str, Any] = {}

    def keep_raw(http_response: Any = None, **_: Any) -> None:
        captured["raw"] = http_response.raw

    event = f"after-call.{runtime.meta.service_model.service_id.hyphenize()}.{STREAM_OPERATION}"
    runtime.meta.events.register(event, keep_raw, unique_id="lmiserve-keep-raw")
    try:
        answer = runtime.invoke_endpoint_with_response_stream(**request.params())
    finally:
        runtime.meta.events.unregister(event, unique_id="lmiserve-keep-raw")
    raw = captured["raw"]
    answer.pop("Body", None)

    def chunks() -> Iterator[bytes]:
        try:
            yield from raw.stream(64 * 1024, decode_content=False)
        finally:
            raw.release_conn()

    return answer, chunks()


def stream_lines(chunks: Iterator[bytes], emit: Callable[[str], None]) -> int:
    """Decode the event stream, and emit each line of the payload as soon as it is whole.

    Returns the number of lines; raises ``ResponseStreamError`` after emitting the lines before it.
    """
    assembler = LineAssembler()
    count = 0
    for part in payload_parts(chunks):
        for line in assembler.feed(part):
            emit(line)
            count += 1
    for line in assembler.close():
        emit(line)
        count += 1
    return count
