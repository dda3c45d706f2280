"""OpenAI ``/v1/chat/completions``.

Messages go through the model's chat template (done by the route, which owns the tokenizer);
``response_format`` (``json_object``, ``json_schema``), vLLM's ``structured_outputs`` and
``guided_*`` fields (:mod:`.structured_outputs`) and forced tool calls (``tool_choice``
``required`` or a named function) are enforced by constrained decoding; with ``auto`` tool
calls are read out of the model's text. Finish reasons use OpenAI's names.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..errors import ValidationFailed
from ..generation.request import GenerationRequest
from ..wire import GuidedDecoding
from . import tool_calls
from .media_parts import PART_KINDS, chat_refs, template_content
from .openai_common import SamplingFields
from .structured_outputs import StructuredOutputFields
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


class ChatRequest(SamplingFields, StructuredOutputFields):
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
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None

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
        return self

    def other_constraints(self) -> list[str]:
        rf, forced = self.response_format, self.tool_mode in ("named", "required")
        return [name for name, on in (("response_format", rf and rf.type != "text"), ("tool_choice", forced)) if on]

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

    @property
    def template_kwargs(self) -> dict[str, Any]:
        """The chat template's own variables: ``chat_template_kwargs``, and ``reasoning_effort``."""
        kwargs = dict(self.chat_template_kwargs or {})
        if self.reasoning_effort is not None:
            kwargs.setdefault("reasoning_effort", self.reasoning_effort)
        return kwargs

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
        structured = self.structured_guided()
        if structured is not None:
            return structured
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
        chat=True,
    )
