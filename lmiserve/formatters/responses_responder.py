"""OpenAI ``/v1/responses``: the answer to one request, whole or streamed.

The request runs as the chat request it amounts to (see :mod:`.responses_request`); this
responder writes the result as a response object (:mod:`.responses_output`) or its stream of
events (:mod:`.responses_stream`). ``on_done`` is given each finished response object (to keep it,
where the request asked for it to be stored).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import LmiServeError
from ..generation import reasoning
from ..generation.request import RequestOutput
from . import errors, json_wire
from .openai_chat import ChatRequest
from .openai_common import SSE
from .responder import JSON, Responder
from .responses_output import (
    TRUNCATED,
    ResponseObject,
    answer,
    function_call_item,
    logprobs,
    message_item,
    new_id,
    reasoning_item,
    usage,
)
from .responses_request import ResponsesRequest
from .responses_stream import ResponseStream

OnDone = Callable[[dict[str, Any]], None]


def status_of(out: RequestOutput) -> str:
    return "incomplete" if out.sequences[0].finish_reason == TRUNCATED else "completed"


class ResponsesResponder(Responder):
    def __init__(
        self,
        req: ResponsesRequest,
        chat: ChatRequest,
        model: str,
        parser: Any = None,
        on_done: OnDone | None = None,
    ):
        self.req = req
        self.chat = chat
        self.parser = parser
        self.on_done = on_done
        self.stream = req.stream
        self.media_type = SSE if req.stream else JSON
        self.obj = ResponseObject(model, req.echo())
        self.events = ResponseStream(chat, self.obj, parser)
        self.started = False
        self.outs: list[RequestOutput] | None = None

    @property
    def id(self) -> str:
        return self.obj.id

    def start(self, outs: list[RequestOutput]) -> None:
        self.outs = outs

    def _finished(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.on_done is not None:
            self.on_done(body)
        return body

    def output(self, out: RequestOutput) -> list[dict[str, Any]]:
        """The output items of a finished request."""
        seq = out.sequences[0]
        items: list[dict[str, Any]] = []
        reasoning, content = self.parser.split(seq.text) if self.parser is not None else (None, seq.text)
        if reasoning:
            items.append(reasoning_item(new_id("rs"), reasoning, "completed"))
        text, calls = answer(self.chat, content, seq.finish_reason)
        if text is not None and (text or not calls):
            status = "incomplete" if seq.finish_reason == TRUNCATED else "completed"
            entries = logprobs(self.chat, seq.tokens) if not reasoning else []
            items.append(message_item(new_id("msg"), text, status, entries))
        items.extend(function_call_item(new_id("fc"), call, "completed") for call in calls)
        return items

    def body(self, outs: list[RequestOutput]) -> bytes:
        out = outs[0]
        tokens = out.sequences[0].tokens
        used = usage(out, reasoning.thinking_tokens(self.parser, [t.text for t in tokens]) if self.parser else 0)
        return json_wire.dumps(self._finished(self.obj.body(status_of(out), self.output(out), used)))

    def chunk(self, index: int, out: RequestOutput) -> bytes:
        head = b""
        if not self.started:
            self.started = True
            head = self.events.start()
        return head + self.events.update(out.sequences[out.last_index])

    def end(self, outs: list[RequestOutput]) -> bytes:
        out = outs[0]
        body = self.obj.body(status_of(out), self.events.output, usage(out, self.events.reasoning_tokens))
        return self.events.end(self._finished(body))

    def error_chunk(self, message: str) -> bytes:
        used = usage(self.outs[0], self.events.reasoning_tokens) if self.outs else None
        body = self.obj.body("failed", self.events.output, used, {"code": "server_error", "message": message})
        return self.events.failed(body, message)

    def error_body(self, err: LmiServeError) -> tuple[int, bytes]:
        status, body = errors.openai(err)
        return status, json_wire.dumps(body)
