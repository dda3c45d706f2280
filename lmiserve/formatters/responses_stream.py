"""OpenAI ``/v1/responses`` streamed: the events of one response.

Each event is ``event: <type>`` and ``data: <json>`` (with the same ``type`` and a
``sequence_number`` counting from 0). A response streams ``response.created`` and
``response.in_progress``; then, for the reasoning (when the model's reasoning parser finds some),
a ``reasoning`` item: ``response.output_item.added``, ``response.content_part.added``,
``response.reasoning_text.delta``\\ s, ``response.reasoning_text.done``, ``response.content_part.done``,
``response.output_item.done``; for the answer a ``message`` item the same way with
``response.output_text.delta``\\ s and ``.done``; for each function call a ``function_call`` item
with ``response.function_call_arguments.delta`` and ``.done``; and last ``response.completed`` (or
``response.incomplete`` when the token limit cut it short). Forced calls, and text that may turn
out to be a call under ``tool_choice: "auto"``, are held back until the end.
"""

from __future__ import annotations

from typing import Any

from ..generation.request import SequenceOutput, TokenOutput
from . import json_wire, tool_calls
from .openai_chat import ChatRequest
from .responses_output import (
    TRUNCATED,
    ResponseObject,
    answer,
    function_call_item,
    logprobs,
    message_item,
    new_id,
    output_text,
    reasoning_item,
    reasoning_text,
)


def event(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + json_wire.dumps(data) + b"\n\n"


def delta_logprobs(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Log-probabilities as a text delta event carries them (token, logprob, top_logprobs)."""
    return [
        {
            "token": e["token"],
            "logprob": e["logprob"],
            "top_logprobs": [{"token": a["token"], "logprob": a["logprob"]} for a in e["top_logprobs"]],
        }
        for e in entries
    ]


class _Item:
    """An output item being streamed: its id, its place in ``output`` and its text so far."""

    def __init__(self, prefix: str, index: int):
        self.id = new_id(prefix)
        self.index = index
        self.text = ""
        self.closed = False


class ResponseStream:
    """The events of one streamed response, from the sequence's updates."""

    def __init__(self, req: ChatRequest, obj: ResponseObject, parser: Any = None):
        self.req = req
        self.obj = obj
        self.parser = parser.stream() if parser is not None else None
        self.sequence_number = 0
        self.output: list[dict[str, Any]] = []
        self.reasoning: _Item | None = None
        self.message: _Item | None = None
        self.content = ""
        """The answer's text so far (reasoning left out)."""
        self.holding = req.tool_mode in ("named", "required")
        self.pending: list[TokenOutput] = []
        """Answer tokens whose log-probabilities are not sent yet."""
        self.reasoning_tokens = 0

    def emit(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self.sequence_number, **fields}
        self.sequence_number += 1
        return event(kind, data)

    def start(self) -> bytes:
        body = self.obj.body("in_progress", [])
        return self.emit("response.created", response=body) + self.emit("response.in_progress", response=body)

    def update(self, seq: SequenceOutput) -> bytes:
        """The events of the latest update of ``seq`` (its ``new_tokens``)."""
        reasoning, content = "", ""
        for token in seq.new_tokens:
            if self.parser is not None:
                thinking = self.parser.thinking
                r, c = self.parser.feed(token.text)
                self.reasoning_tokens += thinking or bool(r)
            else:
                r, c = "", token.text
            if c or self.parser is None:
                self.pending.append(token)
            reasoning += r
            content += c
        if seq.finished and self.parser is not None:
            r, c = self.parser.finish()
            reasoning += r
            content += c
        parts = [self._reasoning(reasoning), self._content(content)]
        if seq.finished:
            parts.append(self._finish(seq))
        return b"".join(parts)

    def _reasoning(self, delta: str) -> bytes:
        if not delta:
            return b""
        parts = []
        item = self.reasoning
        if item is None:
            item = self.reasoning = _Item("rs", len(self.output))
            parts.append(self._added(reasoning_item(item.id, "", "in_progress")))
            parts.append(self._part("added", item, reasoning_text("")))
        item.text += delta
        parts.append(
            self.emit(
                "response.reasoning_text.delta", item_id=item.id, output_index=item.index, content_index=0, delta=delta
            )
        )
        return b"".join(parts)

    def _close_reasoning(self) -> bytes:
        item = self.reasoning
        if item is None or item.closed:
            return b""
        item.closed = True
        common = {"item_id": item.id, "output_index": item.index, "content_index": 0}
        parts = [
            self.emit("response.reasoning_text.done", **common, text=item.text),
            self._part("done", item, reasoning_text(item.text)),
            self._done(reasoning_item(item.id, item.text, "completed")),
        ]
        return b"".join(parts)

    def _content(self, delta: str) -> bytes:
        if not delta:
            return b""
        closing = self._close_reasoning()
        self.content += delta
        if self.message is None and (
            self.holding or (self.req.tool_mode == "auto" and tool_calls.may_become_call(self.content))
        ):
            return closing
        send = self.content[self._sent() : self._end()]
        return closing + (self._text(send) if send else b"")

    def _sent(self) -> int:
        return len(self.message.text) if self.message is not None else 0

    def _end(self) -> int:
        """How far the answer may be sent: up to where a tool call may begin (the rest is held)."""
        cut = tool_calls.call_start(self.content) if self.req.tool_mode == "auto" else None
        return len(self.content) if cut is None else cut

    def _open_message(self) -> bytes:
        item = self.message = _Item("msg", len(self.output))
        return self._added(message_item(item.id, "", "in_progress")) + self._part("added", item, output_text(""))

    def _text(self, delta: str) -> bytes:
        opening = self._open_message() if self.message is None else b""
        item = self.message
        assert item is not None
        item.text += delta
        entries = delta_logprobs(logprobs(self.req, self.pending))
        self.pending = []
        return opening + self.emit(
            "response.output_text.delta",
            item_id=item.id,
            output_index=item.index,
            content_index=0,
            delta=delta,
            logprobs=entries,
        )

    def _finish(self, seq: SequenceOutput) -> bytes:
        parts = [self._close_reasoning()]
        truncated = seq.finish_reason == TRUNCATED
        if self.message is None:
            text, calls = answer(self.req, self.content, seq.finish_reason)
            if text is not None and (text or not calls):
                parts.append(self._text(text) if text else self._open_message())
        else:
            calls = answer(self.req, self.content, seq.finish_reason)[1]
            held = self.content[self._sent() :]
            if held and not calls:  # what looked like the start of a call was text after all
                parts.append(self._text(held))
        if self.message is not None:
            item = self.message
            common = {"item_id": item.id, "output_index": item.index, "content_index": 0}
            final = output_text(item.text, [] if self.parser else logprobs(self.req, seq.tokens))
            parts.append(
                self.emit(
                    "response.output_text.done", **common, text=item.text, logprobs=delta_logprobs(final["logprobs"])
                )
            )
            parts.append(self._part("done", item, final))
            done = message_item(item.id, item.text, "incomplete" if truncated else "completed", final["logprobs"])
            parts.append(self._done(done))
        for call in calls:
            parts.append(self._call(call))
        return b"".join(parts)

    def _call(self, call: tool_calls.ToolCall) -> bytes:
        item_id, index = new_id("fc"), len(self.output)
        common = {"item_id": item_id, "output_index": index}
        return b"".join(
            [
                self._added(function_call_item(item_id, call, "in_progress")),
                self.emit("response.function_call_arguments.delta", **common, delta=call.arguments),
                self.emit("response.function_call_arguments.done", **common, arguments=call.arguments),
                self._done(function_call_item(item_id, call, "completed")),
            ]
        )

    def _added(self, item: dict[str, Any]) -> bytes:
        return self.emit("response.output_item.added", output_index=len(self.output), item=item)

    def _done(self, item: dict[str, Any]) -> bytes:
        self.output.append(item)
        return self.emit("response.output_item.done", output_index=len(self.output) - 1, item=item)

    def _part(self, stage: str, item: _Item, part: dict[str, Any]) -> bytes:
        return self.emit(
            f"response.content_part.{stage}", item_id=item.id, output_index=item.index, content_index=0, part=part
        )

    def end(self, body: dict[str, Any]) -> bytes:
        """The last event: ``response.completed`` or ``response.incomplete``, with the whole response."""
        kind = "response.incomplete" if body["status"] == "incomplete" else "response.completed"
        return self.emit(kind, response=body)

    def failed(self, body: dict[str, Any], message: str) -> bytes:
        """A failure after the stream began: an ``error`` event, then ``response.failed``."""
        error = self.emit("error", code="server_error", message=message, param=None)
        return error + self.emit("response.failed", response=body)
