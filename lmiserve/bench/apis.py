"""How each client protocol asks for a streamed generation and reports its tokens (lines of the
stream as bytes, parsed with orjson)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

DATA = b"data:"


@dataclass(frozen=True)
class Api:
    name: str
    path: str

    def body(self, prompt: str, max_new_tokens: int, model: str, adapter: str = "") -> dict[str, Any]:
        """The request; ``adapter`` names a LoRA adapter in the protocol's way ("" for none)."""
        raise NotImplementedError

    def tokens_in(self, line: bytes) -> int:
        """Generated tokens carried by one line of the stream (0 for framing)."""
        raise NotImplementedError


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

    def tokens_in(self, line: bytes) -> int:
        line = line.removeprefix(DATA).strip()
        if not line:
            return 0
        data = orjson.loads(line)
        if data.get("details", {}) and (data.get("details") or {}).get("finish_reason") == "error":
            raise RuntimeError("the server reported a generation error")
        return 1 if "token" in data else 0


class TgiApi(Api):
    def body(self, prompt: str, max_new_tokens: int, model: str, adapter: str = "") -> dict[str, Any]:
        parameters: dict[str, Any] = {"max_new_tokens": max_new_tokens, "do_sample": False}
        if adapter:
            parameters["adapter_id"] = adapter
        return {"inputs": prompt, "parameters": parameters}

    def tokens_in(self, line: bytes) -> int:
        if not line.startswith(DATA):
            return 0
        data = orjson.loads(line[len(DATA) :])
        if "error" in data:
            raise RuntimeError(data["error"])
        return 1 if "token" in data else 0


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
        return {"max_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True, "stream": True}

    def tokens_in(self, line: bytes) -> int:
        data = sse_event(line)
        return 1 if data and data.get("choices") and data["choices"][0].get("text") is not None else 0


class OpenAiChatApi(OpenAiApi):
    """OpenAI chat, one user message per prompt; a chunk of answer or thinking text is a token."""

    def body(self, prompt: str, max_new_tokens: int, model: str, adapter: str = "") -> dict[str, Any]:
        return {
            "model": adapter or model,
            "messages": [{"role": "user", "content": prompt}],
            **self.sampling(max_new_tokens),
        }

    def tokens_in(self, line: bytes) -> int:
        data = sse_event(line)
        delta = data["choices"][0].get("delta", {}) if data and data.get("choices") else {}
        return 1 if delta.get("content") or delta.get("reasoning_content") else 0


APIS: dict[str, Api] = {
    "lmi": LmiApi("lmi", "/invocations"),
    "tgi": TgiApi("tgi", "/generate_stream"),
    "openai": OpenAiApi("openai", "/v1/completions"),
    "openai-chat": OpenAiChatApi("openai-chat", "/v1/chat/completions"),
}
