"""OpenAI ``/v1/chat/completions``.

Messages go through the model's chat template (done by the route, which owns the tokenizer);
``response_format`` (``json_object``, ``json_schema``) and forced tool calls (``tool_choice``
``required`` or a named function) are enforced by constrained decoding; with ``auto`` tool
calls are read out of the model's text. Finish reasons use OpenAI's names.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..errors import ValidationFailed
from ..generation.request import GenerationRequest, RequestOutput, SequenceOutput, TokenOutput
from ..wire import GuidedDecoding
from . import json_wire, tool_calls
from .media_parts import PART_KINDS, chat_refs, template_content
from .openai_common import OPENAI_CHAT, SamplingFields, Style, StyledResponder, chosen, finish_reason, usage
from .validation import validated


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    @field_validator("content")
    @classmethod
    def _known_parts(cls, v: Any) -> Any:
        if isinstance(v, list):
            for part in v:
                if part.type != "text" and part.type not in PART_KINDS:
                    raise ValueError(f"content parts of type {part.type!r} are not supported")
        return v

    def template_dict(self) -> dict[str, Any]:
        content: Any = self.content
        if isinstance(content, list) and any(p.type in PART_KINDS for p in content):
            content = template_content([p.model_dump() for p in content])
        elif isinstance(content, list):
            content = "".join(p.text or "" for p in content)
        out: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role, "content": content or ""}
        if self.tool_calls:
            out["tool_calls"] = [_template_call(c) for c in self.tool_calls]
        if self.tool_call_id:
            out["tool_call_id"] = self.tool_call_id
        if self.name:
            out["name"] = self.name
        return out


def _template_call(call: dict[str, Any]) -> dict[str, Any]:
    """Chat templates expect arguments as a mapping; OpenAI sends a JSON string."""
    fn = dict(call.get("function") or {})
    if isinstance(fn.get("arguments"), str):
        try:
            fn["arguments"] = json.loads(fn["arguments"])
        except json.JSONDecodeError:
            pass
    return {**call, "function": fn}


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"] = "function"
    function: FunctionDef


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _schema(self) -> ResponseFormat:
        if self.type == "json_schema":
            if not self.json_schema or not isinstance(self.json_schema.get("schema", {}), dict):
                raise ValueError("json_schema needs {'name', 'schema'}")
        return self


class ChatRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    echo: bool = False

    @model_validator(mode="after")
    def _checks(self) -> ChatRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        if isinstance(self.tool_choice, str) and self.tool_choice not in ("none", "auto", "required"):
            raise ValueError("tool_choice must be none, auto, required or {'type': 'function', 'function': {'name'}}")
        if self.tool_choice not in (None, "none", "auto") and not self.tools:
            raise ValueError("tool_choice needs tools")
        if isinstance(self.tool_choice, dict):
            name = (self.tool_choice.get("function") or {}).get("name")
            if name not in {t.function.name for t in self.tools or []}:
                raise ValueError(f"tool_choice names {name!r}, which is not one of the tools")
        if self.response_format is not None and self.response_format.type != "text" and self.forced_tool is not None:
            raise ValueError("response_format cannot be combined with a forced tool call")
        return self

    @property
    def tool_dicts(self) -> list[dict[str, Any]]:
        return [t.function.model_dump(exclude_none=True) for t in self.tools or []]

    @property
    def tool_mode(self) -> str:
        """none | auto | required | named"""
        if not self.tools or self.tool_choice == "none":
            return "none"
        if isinstance(self.tool_choice, dict):
            return "named"
        return self.tool_choice or "auto"

    @property
    def forced_tool(self) -> str | None:
        if isinstance(self.tool_choice, dict):
            return (self.tool_choice.get("function") or {}).get("name")
        return None

    def template_messages(self) -> list[dict[str, Any]]:
        return [m.template_dict() for m in self.messages]

    def guided(self) -> GuidedDecoding | None:
        mode = self.tool_mode
        if mode == "named":
            tool = next(t for t in self.tool_dicts if t["name"] == self.forced_tool)
            return GuidedDecoding("json_schema", json.dumps(tool_calls.named_schema(tool)))
        if mode == "required":
            return GuidedDecoding(
                "json_schema", json.dumps(tool_calls.required_schema(self.tool_dicts, self.parallel_tool_calls))
            )
        rf = self.response_format
        if (rf is None or rf.type == "text") and mode == "auto" and any(t.get("strict") for t in self.tool_dicts):
            return GuidedDecoding("structural_tag", json.dumps(tool_calls.auto_strict_tag(self.tool_dicts)))
        if rf is None or rf.type == "text":
            return None
        if rf.type == "json_object":
            return GuidedDecoding("json_object")
        return GuidedDecoding("json_schema", json.dumps((rf.json_schema or {}).get("schema", {})))


def parse(data: dict[str, Any]) -> ChatRequest:
    if "messages" not in data:
        raise ValidationFailed("'messages' is required")
    return validated(ChatRequest, data)


def generation_request(req: ChatRequest, prompt: str, default_max_tokens: int) -> GenerationRequest:
    max_tokens = req.max_completion_tokens or req.max_tokens or default_max_tokens
    params = req.sampling(max_tokens, logprobs=(req.top_logprobs or 0) if req.logprobs else 0)
    guided = req.guided()
    if guided is not None:
        import msgspec

        params = msgspec.structs.replace(params, guided=guided)
    return GenerationRequest(
        prompt=prompt,
        params=params,
        stop=list(req.stop),
        include_stop_str_in_output=req.include_stop_str_in_output,
        skip_special_tokens=req.skip_special_tokens,
        token_strings=req.logprobs,
        add_special_tokens=False,
        media=chat_refs(req.messages),
    )


# --- responses ---------------------------------------------------------------------------


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

    def __init__(self, req: ChatRequest, model: str, style: Style = OPENAI_CHAT):
        super().__init__(req, model, style, "chatcmpl")
        self.chunk_object = "chat.completion.chunk"
        self._started: set[tuple[int, int]] = set()
        self._held: dict[tuple[int, int], str] = {}
        self._pending: dict[tuple[int, int], list[TokenOutput]] = {}

    def _logprobs(self, tokens: list[TokenOutput]) -> dict[str, Any] | None:
        if not self.req.logprobs:
            return None
        return {"content": [_logprob_entry(t, self.req.top_logprobs or 0) for t in tokens]}

    def _message(self, seq: SequenceOutput) -> tuple[dict[str, Any], str | None]:
        mode = self.req.tool_mode
        text = seq.text
        if mode in ("named", "required") and seq.finish_reason not in ("length", "error"):
            calls = tool_calls.parse_forced(text, self.req.tool_dicts, self.req.forced_tool)
            return {"role": "assistant", "content": None, "tool_calls": [c.as_dict() for c in calls]}, "tool_calls"
        if mode == "auto":
            content, calls = tool_calls.parse_auto(text, self.req.tool_dicts)
            if calls:
                message = {"role": "assistant", "content": content, "tool_calls": [c.as_dict() for c in calls]}
                return message, "tool_calls"
        return {"role": "assistant", "content": text}, finish_reason(seq)

    def body(self, outs: list[RequestOutput]) -> bytes:
        out = outs[0]
        choices = []
        for rank, seq in enumerate(chosen(out, self.req.n)):
            message, reason = self._message(seq)
            choices.append(
                {"index": rank, "message": message, "logprobs": self._logprobs(seq.tokens), "finish_reason": reason}
            )
        return json_wire.dumps(self.envelope(choices, usage=usage(outs, mindie=self.mindie_usage)))

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return self.frame(self.envelope(choices, self.chunk_object, **extra))

    def chunk(self, index: int, out: RequestOutput) -> bytes:
        seq = out.sequences[out.last_index]
        key = (index, seq.index)
        parts = []
        if key not in self._started:
            self._started.add(key)
            parts.append(
                self._chunk(
                    [
                        {
                            "index": seq.index,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ]
                )
            )
        text = "".join(t.text for t in seq.new_tokens)
        # tokens that add no text yet (part of a character, a held-back stop string) keep their
        # log-probabilities for the next chunk that has text
        pending = self._pending.setdefault(key, [])
        pending.extend(seq.new_tokens)
        mode = self.req.tool_mode
        if mode in ("named", "required") or (mode == "auto" and key in self._held):
            self._held[key] = self._held.get(key, "") + text
            text = ""
        elif mode == "auto" and tool_calls.may_become_call(seq.text):
            self._held[key] = seq.text
            text = ""
        if text:
            parts.append(
                self._chunk(
                    [
                        {
                            "index": seq.index,
                            "delta": {"content": text},
                            "logprobs": self._logprobs(pending),
                            "finish_reason": None,
                        }
                    ]
                )
            )
            pending.clear()
        if seq.finished:
            message, reason = self._message(seq)
            delta: dict[str, Any] = {}
            if message.get("tool_calls"):
                delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]
                if message.get("content"):
                    delta["content"] = message["content"]
            elif key in self._held:
                delta["content"] = seq.text
            closing = self.closing_usage(self.req.include_usage)
            extra = {"usage": closing} if closing is not None else {}
            rest = self._logprobs(pending) if pending and key not in self._held else None
            final = {"index": seq.index, "delta": delta, "logprobs": rest, "finish_reason": reason}
            parts.append(self._chunk([final], **extra))
        return b"".join(parts)

    def end(self, outs: list[RequestOutput]) -> bytes:
        tail = b""
        if self.req.include_usage:
            tail = self._chunk([], usage=usage(outs, mindie=self.mindie_usage))
        return tail + self.style.framing.done
