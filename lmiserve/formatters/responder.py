"""What every protocol's answer to generation requests is made of: :class:`Responder`.

:func:`lmiserve.serving.respond` drives a responder: each update of a streamed request becomes
a :meth:`~Responder.chunk`, an unstreamed request one :meth:`~Responder.body`, and a failure the
protocol's error. A protocol subclasses :class:`Responder` and overrides what it says differently.
"""

from __future__ import annotations

from ..errors import LmiServeError
from ..generation.request import RequestOutput

JSON = "application/json"


def timing_headers(outs: list[RequestOutput]) -> dict[str, str]:
    """TGI's timing headers: queue and inference time (ms), time per token, token counts."""
    if not outs:
        return {}
    arrival = min(o.arrival for o in outs)
    end = max(o.finished_at or o.arrival for o in outs)
    queue_ms = max((o.queue_us[0] if o.queue_us else 0) for o in outs) / 1000
    generated = sum(o.generated_tokens for o in outs)
    total_ms = (end - arrival) * 1000
    inference_ms = max(0.0, total_ms - queue_ms)
    return {
        "x-queue-time": str(int(queue_ms)),
        "x-inference-time": str(int(inference_ms)),
        "x-time-per-token": str(int(inference_ms / generated)) if generated else "0",
        "x-prompt-tokens": str(sum(len(o.prompt_token_ids) for o in outs)),
        "x-generated-tokens": str(generated),
    }


class Responder:
    """A protocol's view of one request's generations.

    A subclass says how a streamed update reads (:meth:`chunk`), the whole unstreamed answer
    (:meth:`body`) and an error before (:meth:`error_body`) or after (:meth:`error_chunk`) the
    first byte; the rest has defaults."""

    stream: bool = False
    media_type: str = JSON
    """The streamed body's media type."""
    body_media_type: str = JSON
    """The unstreamed body's media type."""
    error_media_type: str = JSON
    """The media type of an error answered before the first byte."""
    hold_headers: bool = False
    """Keep the status back until a chunk has something to send, so that a failure before that
    is an error status."""
    truncate_on_timeout: bool = False
    """When the request's time runs out, end each unfinished sequence as if it reached its
    length and answer what was generated, instead of an error."""

    def start(self, outs: list[RequestOutput]) -> None:
        """Sees every output before the first update (usage in every chunk)."""

    def collect(self, index: int, out: RequestOutput) -> None:
        """Sees every update of an unstreamed request (a formatter that answers with what it
        said at each update)."""

    def chunk(self, index: int, out: RequestOutput) -> bytes:
        """What to send for the latest update of output ``index`` (may be empty)."""
        raise NotImplementedError

    def end(self, outs: list[RequestOutput]) -> bytes:
        """What to send after the last update of a stream."""
        return b""

    def body(self, outs: list[RequestOutput]) -> bytes:
        """The whole unstreamed answer."""
        raise NotImplementedError

    def headers(self, outs: list[RequestOutput]) -> dict[str, str]:
        """The unstreamed answer's headers: TGI's timing headers."""
        return timing_headers(outs)

    def error_chunk(self, message: str) -> bytes:
        """A failure after the stream began, as the stream's last piece."""
        raise NotImplementedError

    def error_body(self, err: LmiServeError) -> tuple[int, bytes]:
        """A failure before the first byte: the status and the protocol's error body."""
        raise NotImplementedError
