"""A handler's answer to one generation request, read as the engine's deltas.

The handler answers in LMI's schemas, as DJL handlers do: streamed lines of the rolling-batch
schema (``{"token": {"id", "text", "log_prob"}}``, the last with ``details.finish_reason``),
the dynamic-batch schema's ``{"outputs": [text]}`` lines, or one body
(``[{"generated_text": ...}]``, with ``details.tokens`` where the handler gives them). Tokens
come as the handler's ids where it names them, otherwise as the model's tokenization of the
text it returned. Where the handler does not say why a sequence ended, it ended by its length
when it reached ``max_new_tokens`` and by its end-of-sequence token otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson

from .. import wire
from ..errors import LmiServeError
from .response_stream import ResponseStream

REASONS = {"length": "length", "eos_token": "eos_token", "stop_sequence": "stop_sequence", "stop": "eos_token"}
"""The handler's finish reasons, as the engine names them (``stop``: an end, however it came)."""


class _Answer:
    """What one handler answer (one sequence of the request) has produced so far."""

    def __init__(self, index: int, response: ResponseStream):
        self.index = index
        self.response = response
        self.generated = 0
        self.ended = False


class HandlerDeltas:
    """The deltas of one request answered by a handler, one answer per sequence (iterate it;
    ``ready``; ``fail``)."""

    def __init__(
        self,
        request_id: str,
        responses: list[ResponseStream],
        tokenize: Callable[[str], list[int]],
        max_new_tokens: int,
    ):
        self.request_id = request_id
        self.answers = [_Answer(i, r) for i, r in enumerate(responses)]
        self.tokenize = tokenize
        self.max_new_tokens = max_new_tokens
        self._queue: asyncio.Queue[wire.SeqDelta | BaseException] = asyncio.Queue()
        self._pumps = [asyncio.ensure_future(self._read(a)) for a in self.answers]

    @property
    def ready(self) -> bool:
        return not self._queue.empty()

    def fail(self, error: BaseException) -> None:
        self._queue.put_nowait(error)

    def close(self, index: int | None = None) -> None:
        """A sequence (None: all) no longer wanted: stop reading it (a job still queued is dropped)."""
        for answer, pump in zip(self.answers, self._pumps):
            if index is None or answer.index == index:
                answer.response.finished = True
                pump.cancel()

    async def __aiter__(self) -> AsyncIterator[wire.SeqDelta]:
        left = len(self.answers)
        while left:
            item = await self._queue.get()
            if isinstance(item, BaseException):
                raise item
            yield item
            if item.error is not None:
                return
            if item.finish_reason is not None:
                left -= 1

    # --- reading the handler's answers ---------------------------------------------------
    async def _read(self, answer: _Answer) -> None:
        try:
            head = await answer.response.head
            if head.code != 200:
                text = _error_text(bytes(head.body or b""), head.code)
                self._error(answer, text, "validation" if head.code < 500 else "")
                return
            if not head.streaming:
                self._body(answer, bytes(head.body or b""))
                return
            pending = b""
            async for chunk in answer.response.chunks():
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    self._line(answer, line)
            self._line(answer, pending)
            self._end(answer)
        except LmiServeError as err:
            self._error(answer, err.detail, "validation" if err.status < 500 else "")
        except ValueError as err:
            self._error(answer, f"the handler's answer is not LMI's output schema: {err}", "")

    def _put(  # noqa: PLR0913 - one delta's parts
        self,
        answer: _Answer,
        ids: list[int],
        logprobs: list[float],
        finish: str | None,
        details: Any = None,
        tops: list[Any] | None = None,
    ) -> None:
        if answer.ended or (not ids and finish is None):
            return
        answer.generated += len(ids)
        answer.ended = finish is not None
        delta = wire.SeqDelta(
            request_id=self.request_id, index=answer.index, token_ids=ids, logprobs=logprobs, finish_reason=finish
        )
        delta.prompt_logprobs = _prefill(details)
        if tops is not None and len(tops) == len(ids):
            delta.top_logprobs = [_top_row(row) for row in tops]
        self._queue.put_nowait(delta)

    def _error(self, answer: _Answer, message: str, kind: str) -> None:
        if not answer.ended:
            answer.ended = True
            delta = wire.SeqDelta(
                request_id=self.request_id, index=answer.index, finish_reason="error", error=message, error_kind=kind
            )
            self._queue.put_nowait(delta)

    def _end(self, answer: _Answer) -> None:
        """The answer ended without saying why: as the module docstring says."""
        self._put(answer, [], [], "length" if answer.generated >= self.max_new_tokens else "eos_token")

    def _line(self, answer: _Answer, line: bytes) -> None:
        line = line.strip()
        if line.startswith(b"data:"):  # a handler that streams server-sent events
            line = line[5:].strip()
        if not line:
            return
        data = orjson.loads(line)
        if not isinstance(data, dict):
            raise ValueError("a streamed line is not a JSON object")
        if "error" in data and "token" not in data and "outputs" not in data:
            self._error(answer, str(data.get("error")), "")
            return
        finish = _finish(data.get("details"))
        if finish == "error":
            self._error(answer, str(data.get("error") or "the handler failed the request"), "")
            return
        token = data.get("token")
        if isinstance(token, dict) and isinstance(token.get("id"), int):
            logprob = token.get("log_prob")
            logprobs = [float(logprob)] if isinstance(logprob, int | float) else []
            tops = [data["top_tokens"]] if isinstance(data.get("top_tokens"), list) else None
            self._put(answer, [token["id"]], logprobs, finish, data.get("details"), tops)
            return
        outputs = data.get("outputs")
        text = outputs[0] if isinstance(outputs, list) and outputs else data.get("generated_text")
        if isinstance(token, dict):
            text = token.get("text")
        self._put(
            answer, self.tokenize(text) if isinstance(text, str) and text else [], [], finish, data.get("details")
        )

    def _body(self, answer: _Answer, body: bytes) -> None:
        data = orjson.loads(body) if body.strip() else None
        first = data[0] if isinstance(data, list) and data else data
        if not isinstance(first, dict) or not isinstance(first.get("generated_text"), str):
            raise ValueError('the body is not [{"generated_text": ...}]')
        details = first.get("details") if isinstance(first.get("details"), dict) else {}
        tokens = details.get("tokens")
        if isinstance(tokens, list) and all(isinstance(t, dict) and isinstance(t.get("id"), int) for t in tokens):
            ids = [t["id"] for t in tokens]
            lps = [t.get("log_prob") for t in tokens]
            logprobs = [float(v) for v in lps] if all(isinstance(v, int | float) for v in lps) else []
        else:
            ids, logprobs = self.tokenize(first["generated_text"]), []
        tops = details.get("top_tokens")
        self._put(answer, ids, logprobs, _finish(details), details, tops if isinstance(tops, list) else None)
        self._end(answer)


def _prefill(details: Any) -> list[float | None] | None:
    """The prompt's log-probabilities from ``details.prefill`` (None where the handler gave none)."""
    rows = details.get("prefill") if isinstance(details, dict) else None
    if not isinstance(rows, list) or not rows:
        return None
    values = [row.get("log_prob") if isinstance(row, dict) else None for row in rows]
    return [float(v) if isinstance(v, int | float) else None for v in values]


def _top_row(row: Any) -> list[wire.TopLogprob]:
    """One step's top tokens (``[{"id", "log_prob"}, ...]``)."""
    out = []
    for entry in row if isinstance(row, list) else []:
        if isinstance(entry, dict) and isinstance(entry.get("id"), int):
            value = entry.get("log_prob")
            out.append(wire.TopLogprob(entry["id"], float(value) if isinstance(value, int | float) else 0.0))
    return out


def _finish(details: Any) -> str | None:
    if not isinstance(details, dict) or not isinstance(details.get("finish_reason"), str):
        return None
    reason = details["finish_reason"]
    return "error" if reason == "error" else REASONS.get(reason, "eos_token")


def _error_text(body: bytes, status: int) -> str:
    with contextlib.suppress(ValueError):
        data = orjson.loads(body)
        if isinstance(data, dict):
            for key in ("error", "message", "detail"):
                if isinstance(data.get(key), str):
                    return data[key]
    return f"the handler answered {status}: {body[:300].decode(errors='replace')}"
