"""OpenAI ``/v1/responses``: output items and the response object.

A response's ``output`` is a list of items: a ``reasoning`` item when the model's reasoning parser
found reasoning, then the answer as a ``message`` item (one ``output_text`` part) and its calls as
``function_call`` items. The response object repeats the request's settings, as OpenAI's does.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from ..generation.request import RequestOutput, TokenOutput
from . import tool_calls
from .openai_chat import ChatRequest

TRUNCATED = "length"
"""The finish reason of a sequence that reached its token limit."""


def new_id(prefix: str) -> str:
    """An id as OpenAI writes them: ``resp_…``, ``msg_…``, ``rs_…``, ``fc_…``."""
    return f"{prefix}_{uuid.uuid4().hex}"


def output_text(text: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


def message_item(item_id: str, text: str, status: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    content = [output_text(text, logprobs)] if status != "in_progress" else []
    return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": content}


def reasoning_text(text: str) -> dict[str, Any]:
    return {"type": "reasoning_text", "text": text}


def reasoning_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    content = [reasoning_text(text)] if status != "in_progress" else []
    return {"id": item_id, "type": "reasoning", "summary": [], "content": content, "status": status}


def function_call_item(item_id: str, call: tool_calls.ToolCall, status: str) -> dict[str, Any]:
    arguments = call.arguments if status != "in_progress" else ""
    return {
        "id": item_id,
        "type": "function_call",
        "call_id": call.id,
        "name": call.name,
        "arguments": arguments,
        "status": status,
    }


def _logprob(token: str, logprob: float | None) -> dict[str, Any]:
    return {"token": token, "bytes": list(token.encode("utf-8")), "logprob": logprob}


def logprobs(req: ChatRequest, tokens: list[TokenOutput]) -> list[dict[str, Any]]:
    """The log-probabilities of ``tokens`` (with the ``top_logprobs`` most likely at each), when asked for."""
    if not req.logprobs:
        return []
    top = req.top_logprobs or 0
    return [
        {
            **_logprob(t.token if t.token is not None else t.text, t.logprob),
            "top_logprobs": [_logprob(a.token or a.text, a.logprob) for a in (t.top or [])[:top]],
        }
        for t in tokens
    ]


def answer(req: ChatRequest, content: str, finish_reason: str | None) -> tuple[str | None, list[tool_calls.ToolCall]]:
    """``(text, calls)`` of the answer part of the output: the calls the model made (forced ones
    read from the constrained output, ``auto`` ones out of its text) and the text beside them
    (None when there is none)."""
    mode = req.tool_mode
    if mode in ("named", "required") and finish_reason != TRUNCATED:
        try:
            return None, tool_calls.parse_forced(content, req.tool_dicts, req.forced_tool)
        except (json.JSONDecodeError, TypeError, AttributeError):
            return content, []
    if mode == "auto":
        return tool_calls.parse_auto(content, req.tool_dicts)
    return content, []


def usage(out: RequestOutput, reasoning: int = 0) -> dict[str, Any]:
    prompt = len(out.prompt_token_ids)
    generated = out.generated_tokens
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": out.num_cached_tokens, "cache_write_tokens": 0},
        "output_tokens": generated,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": prompt + generated,
    }


class ResponseObject:
    """The response object of one request, at each stage: created, in progress, finished."""

    def __init__(self, model: str, echo: dict[str, Any], response_id: str | None = None):
        self.id = response_id or new_id("resp")
        self.model = model
        self.echo = echo
        self.created_at = int(time.time())

    def body(
        self,
        status: str,
        output: list[dict[str, Any]],
        usage: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "model": self.model,
            "output": output,
            "usage": usage,
            **self.echo,
        }
        if status == "completed":
            out["completed_at"] = int(time.time())
        return out
