"""OpenAI ``/v1/responses``: the request body.

A Responses request is read into :class:`ResponsesRequest` and then expressed as the chat request
it amounts to (:meth:`ResponsesRequest.chat_request`): its conversation as chat messages, its
function tools, ``tool_choice`` and ``text.format`` in chat's terms, so that the prompt, the
constrained decoding and the tool-call parsing are chat's. Fields OpenAI's clients may send that
are not listed here are ignored.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..errors import ValidationFailed
from .openai_chat import ChatRequest
from .validation import validated, without_nulls

LOGPROBS_INCLUDE = "message.output_text.logprobs"
"""The ``include`` entry that asks for the output text's log-probabilities."""
SAMPLING_EXTRAS = (
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stop_token_ids",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "ignore_eos",
    "min_tokens",
    "skip_special_tokens",
    "chat_template_kwargs",
)
"""vLLM's fields outside OpenAI's schema (sampling, the chat template's variables), taken as chat
takes them when a client sends them."""


class FunctionTool(BaseModel):
    """A function tool as the Responses API writes it: flat, without chat's ``function`` wrapper."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _function_only(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("type") != "function":
            raise ValueError(f"tools of type {data.get('type')!r} are not supported; only 'function' tools are")
        return without_nulls(data)

    def echo(self) -> dict[str, Any]:
        return {
            "type": "function",
            "name": self.name,
            "description": self.description,
            "parameters": self.parameters,
            "strict": self.strict,
        }

    def chat_tool(self) -> dict[str, Any]:
        function = {"name": self.name, "description": self.description, "parameters": self.parameters}
        if self.strict is not None:
            function["strict"] = self.strict
        return {"type": "function", "function": {k: v for k, v in function.items() if v is not None}}


class TextFormat(BaseModel):
    """``text.format``: plain text, any JSON object, or JSON matching a schema."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(None, pattern=r"^[A-Za-z0-9_-]{1,64}$")
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    description: str | None = None
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema(self) -> TextFormat:
        if self.type == "json_schema" and (self.name is None or self.schema_ is None):
            raise ValueError("a json_schema format needs 'name' and 'schema'")
        return self

    def echo(self) -> dict[str, Any]:
        if self.type != "json_schema":
            return {"type": self.type}
        out = {"type": "json_schema", "name": self.name, "schema": self.schema_, "strict": self.strict}
        if self.description is not None:
            out["description"] = self.description
        return out

    def response_format(self) -> dict[str, Any]:
        if self.type != "json_schema":
            return {"type": self.type}
        return {
            "type": "json_schema",
            "json_schema": {"name": self.name, "schema": self.schema_, "strict": self.strict},
        }


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None

    @model_validator(mode="before")
    @classmethod
    def _nulls(cls, data: Any) -> Any:
        return without_nulls(data)


class ReasoningConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None


class ResponsesRequest(BaseModel):
    """The fields of a ``POST /v1/responses`` body this server reads."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    model: str | None = None
    input: str | list[dict[str, Any]] | None = None
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=1e-6, le=1.0)
    tools: list[FunctionTool] = []
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] = "auto"
    parallel_tool_calls: bool = True
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    include: list[str] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    background: bool = False
    extras: dict[str, Any] = {}
    """The :data:`SAMPLING_EXTRAS` the body carried."""

    @model_validator(mode="before")
    @classmethod
    def _before(cls, data: Any) -> Any:
        data = without_nulls(data)
        if isinstance(data, dict):
            data = {**data, "extras": {k: data[k] for k in SAMPLING_EXTRAS if k in data}}
        return data

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        if v is not None and len(v) > 16:
            raise ValueError("at most 16 metadata pairs")
        return v

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, v: Any) -> Any:
        if isinstance(v, dict) and (v.get("type") != "function" or not isinstance(v.get("name"), str)):
            raise ValueError("tool_choice must be none, auto, required or {'type': 'function', 'name': ...}")
        return v

    @model_validator(mode="after")
    def _checks(self) -> ResponsesRequest:
        if self.background:
            raise ValueError("background responses are not supported")
        if self.input is None and self.previous_response_id is None:
            raise ValueError("'input' is required")
        if isinstance(self.tool_choice, dict) and self.tool_choice["name"] not in {t.name for t in self.tools}:
            raise ValueError(f"tool_choice names {self.tool_choice['name']!r}, which is not one of the tools")
        if self.tool_choice == "required" and not self.tools:
            raise ValueError("tool_choice 'required' needs tools")
        return self

    @property
    def logprobs(self) -> bool:
        return LOGPROBS_INCLUDE in (self.include or ())

    def chat_request(self, messages: list[dict[str, Any]]) -> ChatRequest:
        """The chat request this request amounts to, for ``messages`` (the whole conversation); the
        reasoning effort goes to the chat template as ``reasoning_effort``."""
        fmt = self.text.format if self.text else None
        kwargs = dict(self.extras.get("chat_template_kwargs") or {})
        if self.reasoning and self.reasoning.effort:
            kwargs.setdefault("reasoning_effort", self.reasoning.effort)
        data: dict[str, Any] = {
            **self.extras,
            "model": self.model,
            "messages": messages,
            "max_completion_tokens": self.max_output_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "stream": self.stream,
            "logprobs": self.logprobs,
            "top_logprobs": self.top_logprobs if self.logprobs else None,
            "tools": [t.chat_tool() for t in self.tools] or None,
            "tool_choice": self.chat_tool_choice(),
            "parallel_tool_calls": self.parallel_tool_calls,
            "response_format": fmt.response_format() if fmt else None,
            "chat_template_kwargs": kwargs or None,
        }
        return validated(ChatRequest, data)

    def chat_tool_choice(self) -> str | dict[str, Any] | None:
        if isinstance(self.tool_choice, dict):
            return {"type": "function", "function": {"name": self.tool_choice["name"]}}
        return self.tool_choice if self.tools else None

    def echo(self) -> dict[str, Any]:
        """The request's settings as a response object repeats them."""
        fmt = self.text.format if self.text and self.text.format else TextFormat(type="text")
        text: dict[str, Any] = {"format": fmt.echo()}
        if self.text and self.text.verbosity:
            text["verbosity"] = self.text.verbosity
        return {
            "instructions": self.instructions,
            "max_output_tokens": self.max_output_tokens,
            "metadata": self.metadata or {},
            "parallel_tool_calls": self.parallel_tool_calls,
            "previous_response_id": self.previous_response_id,
            "reasoning": self.reasoning.model_dump() if self.reasoning else None,
            "store": self.store,
            "temperature": 1.0 if self.temperature is None else self.temperature,
            "text": text,
            "tool_choice": self.tool_choice,
            "tools": [t.echo() for t in self.tools],
            "top_logprobs": self.top_logprobs,
            "top_p": 1.0 if self.top_p is None else self.top_p,
            "truncation": self.truncation or "disabled",
            "user": self.user,
            "background": False,
        }


def parse(data: dict[str, Any]) -> ResponsesRequest:
    if not isinstance(data, dict):
        raise ValidationFailed("the body must be a JSON object")
    return validated(ResponsesRequest, data)
