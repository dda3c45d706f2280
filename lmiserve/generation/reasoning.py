"""Reasoning models' thinking, told apart from their answer.

A reasoning parser reads a sequence's text, as it streams or whole, and says which part is the
model's thinking and which its answer. The markers are text (``<think>``, ``</think>``; Granite's
"Here is my thought process:"; gpt-oss's harmony channels), so a marker split over several
tokens, or arriving in the same step as answer text, is found all the same: text that might be
the start of a marker is held back until the next piece says whether it is one.

Parsers (``option.reasoning_parser``):

- ``deepseek_r1``: thinking from the first token (the template opens ``<think>``; one the model
  writes itself is dropped) to ``</think>``; the rest is the answer.
- ``qwen3``: the same markers; a ``<tool_call>`` also ends the thinking (and stays in the answer,
  where tool calls are read). A request with ``enable_thinking: false`` is not parsed.
- ``granite``: answer text until "Here is my thought process:" (or "Here's ..."), thinking until
  "Here is my response:", the answer after it.
- ``gpt_oss``: harmony messages; the ``analysis`` channel is thinking, ``final`` and ``commentary``
  the answer; the channel headers and message ends are dropped.

A model that stops while still thinking gives its thinking and an empty answer.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
TOOL_OPEN = "<tool_call>"
GRANITE_THINK = ("Here is my thought process:", "Here's my thought process:")
GRANITE_ANSWER = ("Here is my response:", "Here's my response:")
HARMONY_MESSAGE = "<|message|>"
HARMONY_ENDS = ("<|end|>", "<|return|>", "<|call|>")


@dataclass(frozen=True)
class Markers:
    """A parser's markers. ``opens`` enter the thinking and ``closes`` leave it (both dropped);
    ``ends_kept`` leave it too but stay in the answer. ``thinking_first``: the output starts inside
    the thinking (the template opened it)."""

    name: str
    thinking_first: bool
    opens: tuple[str, ...]
    closes: tuple[str, ...]
    ends_kept: tuple[str, ...] = ()


PARSERS: dict[str, Markers] = {
    "deepseek_r1": Markers("deepseek_r1", True, (THINK_OPEN,), (THINK_CLOSE,)),
    "qwen3": Markers("qwen3", True, (THINK_OPEN,), (THINK_CLOSE,), (TOOL_OPEN,)),
    "granite": Markers("granite", False, GRANITE_THINK, GRANITE_ANSWER),
}
NAMES = (*PARSERS, "gpt_oss")
"""Every parser's name (``auto`` picks one of them for a model, see :func:`detect`)."""


@functools.cache
def _starts(markers: tuple[str, ...]) -> tuple[int, frozenset[str]]:
    """The longest marker's length and the markers' first characters."""
    return max(map(len, markers)), frozenset(m[0] for m in markers)


def _held_back(text: str, markers: tuple[str, ...]) -> int:
    """How many characters at the end of ``text`` could be the start of one of ``markers``."""
    longest, firsts = _starts(markers)
    start = max(0, len(text) - longest + 1)
    earliest = len(text)
    for first in firsts:
        i = text.find(first, start)
        while 0 <= i < earliest:
            tail = text[i:]
            if any(m.startswith(tail) for m in markers):
                earliest = i
                break
            i = text.find(first, i + 1)
    return len(text) - earliest


class ReasoningStream:
    """One sequence's text as it streams: :meth:`feed` each new piece, :meth:`finish` at the end.
    Each returns the (thinking, answer) text that piece settled."""

    def __init__(self, markers: Markers):
        self.markers = markers
        self.thinking = markers.thinking_first
        self.entered = markers.thinking_first
        self._held = ""

    def _watched(self) -> tuple[str, ...]:
        m = self.markers
        return (*m.opens, *m.closes, *m.ends_kept) if self.thinking else m.opens if not self.entered else ()

    def feed(self, text: str) -> tuple[str, str]:
        out: tuple[list[str], list[str]] = ([], [])  # thinking, answer
        s = self._held + text
        self._held = ""
        while s:
            s = self._step(s, out)
        return "".join(out[0]), "".join(out[1])

    def _until(self, s: str, markers: tuple[str, ...], out: tuple[list[str], list[str]]) -> tuple[str, str] | None:
        """``s`` up to the first of ``markers`` to the side being read, and (that marker, the text
        after it); None where no marker is whole in ``s`` (a tail that may start one is held)."""
        side = out[0] if self.thinking else out[1]
        hits = [(i, m) for m in markers if (i := s.find(m)) >= 0]
        if not hits:
            keep = _held_back(s, markers)
            side.append(s[: len(s) - keep])
            self._held = s[len(s) - keep :]
            return None
        i, marker = min(hits, key=lambda h: (h[0], -len(h[1])))
        side.append(s[:i])
        return marker, s[i + len(marker) :]

    def _step(self, s: str, out: tuple[list[str], list[str]]) -> str:
        """Read ``s`` up to the next marker; the text left to read."""
        watched = self._watched()
        if not watched:
            out[1].append(s)
            return ""
        if not any(first in s for first in _starts(watched)[1]):  # no marker can start here (most tokens)
            (out[0] if self.thinking else out[1]).append(s)
            return ""
        found = self._until(s, watched, out)
        if found is None:
            return ""
        marker, s = found
        if marker in self.markers.opens:
            self.thinking = self.entered = True
        elif marker in self.markers.ends_kept:
            self.thinking = False
            s = marker + s
        else:
            self.thinking = False
        return s

    def finish(self) -> tuple[str, str]:
        held, self._held = self._held, ""
        return (held, "") if self.thinking else ("", held)


class HarmonyStream(ReasoningStream):
    """gpt-oss's harmony format: ``<|channel|>NAME<|message|>TEXT<|end|>``, one message after
    another (``<|start|>assistant`` between them); ``analysis`` is the thinking."""

    def __init__(self) -> None:
        super().__init__(Markers("gpt_oss", False, (), ()))
        self._header: str | None = ""  # the message's header while it is read, else None

    def _step(self, s: str, out: tuple[list[str], list[str]]) -> str:
        if self._header is not None:
            s = self._header + s
            i = s.find(HARMONY_MESSAGE)
            if i < 0:
                self._header = s
                return ""
            self.thinking = "analysis" in s[:i]
            self.entered = self.entered or self.thinking
            self._header = None
            return s[i + len(HARMONY_MESSAGE) :]
        found = self._until(s, HARMONY_ENDS, out)
        if found is None:
            return ""
        self._header = ""
        return found[1]

    def finish(self) -> tuple[str, str]:
        if self._header:  # a header never closed: plain text after all
            header, self._header = self._header, None
            return "", header
        return super().finish()


class ReasoningParser:
    """A request's parser: :meth:`stream` for a new sequence, :meth:`split` for a whole text."""

    def __init__(self, name: str):
        if name not in NAMES:
            raise ValueError(f"unknown reasoning parser {name!r}; one of {', '.join(NAMES)}")
        self.name = name
        self.special_tokens = name == "gpt_oss"
        """The markers are special tokens, which the text must keep."""
        self.end_marker = THINK_CLOSE if name in ("deepseek_r1", "qwen3") else None
        """The text that ends the thinking, where it is one token in the model's families."""

    def stream(self) -> ReasoningStream:
        return HarmonyStream() if self.name == "gpt_oss" else ReasoningStream(PARSERS[self.name])

    def split(self, text: str) -> tuple[str | None, str]:
        """(thinking, answer) of a whole text; thinking is None where the model never thought."""
        stream = self.stream()
        r1, a1 = stream.feed(text)
        r2, a2 = stream.finish()
        return (r1 + r2 if stream.entered else None), a1 + a2


def thinking_off(template_kwargs: dict[str, Any] | None) -> bool:
    """A request that turns the model's thinking off (Qwen3's ``enable_thinking``, DeepSeek's
    ``thinking``)."""
    kw = template_kwargs or {}
    return kw.get("enable_thinking") is False or kw.get("thinking") is False


def for_request(name: str | None, template_kwargs: dict[str, Any] | None = None) -> ReasoningParser | None:
    """The parser of a request to a model whose parser is ``name`` (None: the model has none, or
    the request turned thinking off)."""
    if name is None or thinking_off(template_kwargs):
        return None
    return ReasoningParser(name)


_GRANITE = re.compile(r"thought process", re.IGNORECASE)


def detect(chat_template: str | None, vocab: dict[str, int] | Any) -> str | None:
    """The parser ``auto`` picks from a model's chat template and its tokenizer's tokens."""
    template = chat_template or ""
    if "<|channel|>" in vocab and "<|message|>" in vocab:
        return "gpt_oss"
    if THINK_CLOSE in vocab or THINK_CLOSE in template:
        return "qwen3" if "enable_thinking" in template else "deepseek_r1"
    if _GRANITE.search(template):
        return "granite"
    return None


def thinking_tokens(parser: ReasoningParser, token_texts: list[str]) -> int:
    """How many of a sequence's tokens (each given by the text it added) belong to the thinking:
    those read while the thinking was open, its closing marker included."""
    stream = parser.stream()
    count = 0
    for text in token_texts:
        was_thinking = stream.thinking
        thinking, _ = stream.feed(text)
        count += was_thinking or bool(thinking)
    return count
