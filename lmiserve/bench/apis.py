"""How each client protocol asks for a streamed generation and reports its tokens and text (lines
of the stream as bytes, parsed with orjson)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

DATA = b"data:"


class Piece(NamedTuple):
    tokens: int
    """Generated tokens the line carries (0 for framing)."""
    text: str = ""
    """Their text."""
    reported: int | None = None
    """The request's generated tokens as the server counts them, where the line says (OpenAI's
    ``usage``): a chunk may carry several tokens (speculative decoding's accepted ones)."""


NOTHING = Piece(0)


@dataclass(frozen=True)
class Api:
    name: str
    path: str

    def body(self, prompt: str, max_new_tokens: int, model: str, adapter: str = "") -> dict[str, Any]:
        """The request; ``adapter`` names a LoRA adapter in the protocol's way ("" for none)."""
        raise NotImplementedError

    def read(self, line: bytes) -> Piece:
        """What one line of the stream carries; a line reporting an error raises."""
        raise NotImplementedError

    def tokens_in(self, line: bytes) -> int:
        """Generated tokens carried by one line of the stream (0 for framing)."""
        return self.read(line).tokens


class LmiApi(Api):
    def body(self, prompt: str, max_new_tokens: int, model: str, adapter: str = "") -> dict[str, Any]:
        body: dict[str, Any] = {
            "inputs": prompt,
            "parameters": {"max_new_tokens": max_new_tokens, "ignore_eos_token": True, "do_sample": False},
            "stream": True,
        }
        if adapter:
            body["adapters"] = adapter
        return body

    def read(self, line: bytes) -> Piece:
        line = line.removeprefix(DATA).strip()
        if not line:
            return NOTHING
        data = orjson.loads(line)
        if data.get("details", {}) and (data.get("details") or {}).get("finish_reason") == "error":
            raise RuntimeError("the server reported a generation error")
        return _token_piece(data)


class TgiApi(Api):
    def body(self, prompt: str, max_new_tokens: int, model: str, adapter: str = "") -> dict[str, Any]:
        parameters: dict[str, Any] = {"max_new_tokens": max_new_tokens, "do_sample": False}
        if adapter:
            parameters["adapter_id"] = adapter
        return {"inputs": prompt, "parameters": parameters}

    def read(self, line: bytes) -> Piece:
        if not line.startswith(DATA):
            return NOTHING
        data = orjson.loads(line[len(DATA) :])
        if "error" in data:
            raise RuntimeError(data["error"])
        return _token_piece(data)


def _token_piece(data: dict[str, Any]) -> Piece:
    """An LMI or TGI line: one ``token``, its text under it."""
    if "token" not in data:
        return NOTHING
    token = data["token"]
    return Piece(1, (token.get("text") or "") if isinstance(token, dict) else "")


def sse_event(line: bytes) -> dict[str, Any] | None:
    """An OpenAI stream line's JSON (None for other lines and ``[DONE]``); an error event raises."""
    if not line.startswith(DATA):
        return None
    payload = line[len(DATA) :].strip()
    if payload == b"[DONE]":
        return None
    data = orjson.loads(payload)
    if "error" in data:
        raise RuntimeError(str(data["error"]))
    return data


class OpenAiApi(Api):
    """OpenAI completions; a chunk with text is a token."""

    def body(self, prompt: str, max_new_tokens: int, model: str, adapter: str = "") -> dict[str, Any]:
        return {"model": adapter or model, "prompt": prompt, **self.sampling(max_new_tokens)}

    @staticmethod
    def sampling(max_new_tokens: int) -> dict[str, Any]:
        return {
            "max_tokens": max_new_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }

    def read(self, line: bytes) -> Piece:
        data = sse_event(line)
        if not data:
            return NOTHING
        text = data["choices"][0].get("text") if data.get("choices") else None
        return Piece(0 if text is None else 1, text or "", _usage(data))


class OpenAiChatApi(OpenAiApi):
    """OpenAI chat, one user message per prompt; a chunk of answer or thinking text is a token."""

    def body(self, prompt: str, max_new_tokens: int, model: str, adapter: str = "") -> dict[str, Any]:
        return {
            "model": adapter or model,
            "messages": [{"role": "user", "content": prompt}],
            **self.sampling(max_new_tokens),
        }

    def read(self, line: bytes) -> Piece:
        data = sse_event(line)
        if not data:
            return NOTHING
        delta = (data["choices"][0].get("delta") or {}) if data.get("choices") else {}
        text = (delta.get("reasoning_content") or "") + (delta.get("content") or "")
        return Piece(1 if text else 0, text, _usage(data))


def _usage(data: dict[str, Any]) -> int | None:
    usage = data.get("usage")
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return tokens if isinstance(tokens, int) else None


APIS: dict[str, Api] = {
    "lmi": LmiApi("lmi", "/invocations"),
    "tgi": TgiApi("tgi", "/generate_stream"),
    "openai": OpenAiApi("openai", "/v1/completions"),
    "openai-chat": OpenAiChatApi("openai-chat", "/v1/chat/completions"),
}
