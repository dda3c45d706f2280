"""OpenAI ``/v1/chat/completions`` answers, whole and streamed (Databricks chat's too, in its style).

With a reasoning parser (:mod:`.reasoning`) the model's thinking goes to ``reasoning_content``
(and vLLM's name for it, ``reasoning``) and the answer to ``content``, in messages and in stream
deltas alike; tool calls are read from the answer only, and ``usage`` counts the thinking's tokens
in ``completion_tokens_details.reasoning_tokens``. Databricks puts the thinking in ``content`` as a
``reasoning`` part. Finish reasons use OpenAI's names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..generation.reasoning import ReasoningParser, ReasoningStream, thinking_tokens
from ..generation.request import RequestOutput, SequenceOutput, TokenOutput
from . import json_wire, tool_calls
from .openai_common import OPENAI_CHAT, Style, StyledResponder, chosen, finish_reason

if TYPE_CHECKING:
    from .openai_chat import ChatRequest


def _logprob_entry(t: TokenOutput, top: int) -> dict[str, Any]:
    token = t.token if t.token is not None else t.text
    entry: dict[str, Any] = {"token": token, "logprob": t.logprob, "bytes": list(token.encode("utf-8"))}
    entry["top_logprobs"] = [
        {"token": a.token or a.text, "logprob": a.logprob, "bytes": list((a.token or a.text).encode("utf-8"))}
        for a in (t.top or [])[:top]
    ]
    return entry


class ChatResponder(StyledResponder):
    req: ChatRequest

    def __init__(
        self, req: ChatRequest, model: str, style: Style = OPENAI_CHAT, reasoning: ReasoningParser | None = None
    ):
        super().__init__(req, model, style, "chatcmpl")
        self.chunk_object = "chat.completion.chunk"
        self.reasoning = reasoning
        self._started: set[tuple[int, int]] = set()
        self._held: dict[tuple[int, int], str] = {}
        self._pending: dict[tuple[int, int], list[TokenOutput]] = {}
        self._streams: dict[tuple[int, int], ReasoningStream] = {}
        self._answers: dict[tuple[int, int], str] = {}
        """Each streamed choice's answer text so far (its text without the thinking)."""
        self._thinking_tokens: dict[tuple[int, int], int] = {}
        """Each streamed choice's tokens read while the thinking was open."""
        self._sent: dict[tuple[int, int], int] = {}
        """How much of each streamed choice's answer went out as content."""

    def _logprobs(self, tokens: list[TokenOutput]) -> dict[str, Any] | None:
        if not self.req.logprobs:
            return None
        return {"content": [_logprob_entry(t, self.req.top_logprobs or 0) for t in tokens]}

    def _thinking(self, text: str) -> dict[str, Any]:
        """A message's or delta's fields that carry thinking."""
        if self.style.reasoning_parts:
            return {"content": [{"type": "reasoning", "summary": [{"type": "summary_text", "text": text}]}]}
        return {"reasoning_content": text, "reasoning": text}

    def _answer(self, seq: SequenceOutput, text: str) -> tuple[dict[str, Any], str | None]:
        mode = self.req.tool_mode
        if mode in ("named", "required") and seq.finish_reason not in ("length", "error"):
            calls = tool_calls.parse_forced(text, self.req.tool_dicts, self.req.forced_tool)
            return {"role": "assistant", "content": None, "tool_calls": [c.as_dict() for c in calls]}, "tool_calls"
        if mode == "auto":
            content, calls = tool_calls.parse_auto(text, self.req.tool_dicts)
            if calls:
                message = {"role": "assistant", "content": content, "tool_calls": [c.as_dict() for c in calls]}
                return message, "tool_calls"
        return {"role": "assistant", "content": text}, finish_reason(seq)

    def _message(self, seq: SequenceOutput) -> tuple[dict[str, Any], str | None]:
        if self.reasoning is None:
            return self._answer(seq, seq.text)
        thinking, text = self.reasoning.split(seq.text)
        message, reason = self._answer(seq, text)
        if thinking is None:
            return message, reason
        fields = self._thinking(thinking)
        if self.style.reasoning_parts and message.get("content"):
            fields["content"].append({"type": "text", "text": message["content"]})
        return {**message, **fields}, reason

    def usage_body(self, outs: list[RequestOutput]) -> dict[str, Any]:
        body = super().usage_body(outs)
        if self.reasoning is not None and self.stream:  # counted as the tokens streamed
            body["completion_tokens_details"] = {"reasoning_tokens": sum(self._thinking_tokens.values())}
        elif self.reasoning is not None:
            counted = sum(
                thinking_tokens(self.reasoning, [t.text for t in s.tokens]) for o in outs for s in o.sequences
            )
            body["completion_tokens_details"] = {"reasoning_tokens": counted}
        return body

    def body(self, outs: list[RequestOutput]) -> bytes:
        out = outs[0]
        choices = []
        for rank, seq in enumerate(chosen(out, self.req.n)):
            message, reason = self._message(seq)
            choices.append(
                {"index": rank, "message": message, "logprobs": self._logprobs(seq.tokens), "finish_reason": reason}
            )
        return json_wire.dumps(self.envelope(choices, usage=self.usage_body(outs)))

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return self.frame(self.envelope(choices, self.chunk_object, **extra))

    def _delta(self, index: int, delta: dict[str, Any], logprobs: Any = None, reason: str | None = None) -> bytes:
        return self._chunk([{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}])

    def _split_delta(self, key: tuple[int, int], seq: SequenceOutput) -> tuple[str, str, str]:
        """The latest update's (thinking, answer) text, and the answer so far."""
        text = "".join(t.text for t in seq.new_tokens)
        if self.reasoning is None:
            return "", text, seq.text
        stream = self._streams.get(key)
        if stream is None:
            stream = self._streams[key] = self.reasoning.stream()
        thinking, text = self._feed(key, stream, seq.new_tokens)
        if seq.finished:
            more_thinking, more_text = stream.finish()
            thinking, text = thinking + more_thinking, text + more_text
        answer = self._answers[key] = self._answers.get(key, "") + text
        return thinking, text, answer

    def _feed(self, key: tuple[int, int], stream: ReasoningStream, tokens: list[TokenOutput]) -> tuple[str, str]:
        """The tokens through the parser one by one, counting those read while it thinks."""
        if len(tokens) == 1:
            thinking = stream.thinking
            r, a = stream.feed(tokens[0].text)
            self._thinking_tokens[key] = self._thinking_tokens.get(key, 0) + (thinking or bool(r))
            return r, a
        parts = [self._feed(key, stream, [t]) for t in tokens]
        return "".join(r for r, _ in parts), "".join(a for _, a in parts)

    def chunk(self, index: int, out: RequestOutput) -> bytes:
        seq = out.sequences[out.last_index]
        key = (index, seq.index)
        parts = []
        if key not in self._started:
            self._started.add(key)
            parts.append(self._delta(seq.index, {"role": "assistant", "content": ""}))
        thinking, text, answer = self._split_delta(key, seq)
        # tokens that add no text yet (part of a character, a held-back stop string) keep their
        # log-probabilities for the next chunk that has text
        pending = self._pending.setdefault(key, [])
        pending.extend(seq.new_tokens)
        if thinking:
            parts.append(self._delta(seq.index, self._thinking(thinking), self._logprobs(pending)))
            pending.clear()
        mode = self.req.tool_mode
        if mode in ("named", "required") or (mode == "auto" and key in self._held):
            self._held[key] = self._held.get(key, "") + text
            text = ""
        elif mode == "auto" and (cut := tool_calls.call_start(answer)) is not None:
            # what comes before a possible call is answer text; from there on it is held back
            before, self._held[key] = answer[:cut], answer[cut:]
            text = before[self._sent.get(key, 0) :]
        if text:
            self._sent[key] = self._sent.get(key, 0) + len(text)
            parts.append(self._delta(seq.index, {"content": text}, self._logprobs(pending)))
            pending.clear()
        if seq.finished:
            parts.append(self._closing(key, seq, pending))
        return b"".join(parts)

    def _closing(self, key: tuple[int, int], seq: SequenceOutput, pending: list[TokenOutput]) -> bytes:
        message, reason = self._message(seq)
        delta: dict[str, Any] = {}
        if message.get("tool_calls"):
            delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]
            content, sent = message.get("content"), self._answers.get(key, seq.text)[: self._sent.get(key, 0)]
            if isinstance(content, str) and content.strip() != sent.strip():
                delta["content"] = content[len(sent) :] if content.startswith(sent) else content
        elif key in self._held:
            delta["content"] = self._held[key]
        closing = self.closing_usage(self.req.include_usage)
        extra = {"usage": closing} if closing is not None else {}
        rest = self._logprobs(pending) if pending and key not in self._held else None
        return self._chunk([{"index": seq.index, "delta": delta, "logprobs": rest, "finish_reason": reason}], **extra)

    def end(self, outs: list[RequestOutput]) -> bytes:
        tail = b""
        if self.req.include_usage:
            tail = self._chunk([], usage=self.usage_body(outs))
        return tail + self.style.framing.done
