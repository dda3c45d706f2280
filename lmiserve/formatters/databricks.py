"""Databricks Foundation Model APIs (``/serving-endpoints/{name}/invocations``).

One endpoint serves three tasks, told apart by the body: ``messages`` (chat), ``prompt``
(completions) and ``input`` (embeddings). The shapes are OpenAI's, with these differences:
``usage`` on every answer, streamed chunks included; a non-streaming chat answer has the
``object`` ``"chat.completions"``; errors are ``{"error_code", "message"}``; ``max_tokens``
defaults to no limit (generation ends at the context length); completions add
``error_behavior``, ``use_raw_prompt`` (otherwise an instruction model's prompt goes through
its chat template as a user message) and ``suffix``/``echo``; embeddings add ``instruction``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from ..errors import BadRequest
from ..generation.request import GenerationRequest
from . import errors
from .openai_chat import ChatRequest
from .openai_common import Style
from .openai_completions import CompletionRequest, generation_requests
from .validation import validated

TASKS = (("messages", "chat"), ("prompt", "completions"), ("input", "embeddings"))

CHAT = Style(
    "chat.completions", errors=errors.databricks, mindie_usage=False, usage_in_chunks=True, reasoning_parts=True
)
COMPLETIONS = Style(
    "text_completion", errors=errors.databricks, mindie_usage=False, usage_in_chunks=True, index_is_prompt=True
)
# The OpenAI-compatible paths of a Databricks workspace (/serving-endpoints/chat/completions)
OPENAI_CHAT = Style(
    "chat.completion", errors=errors.databricks, mindie_usage=False, usage_in_chunks=True, reasoning_parts=True
)


def task_of(data: Any) -> str:
    """chat, completions or embeddings, by the body's fields."""
    if not isinstance(data, dict):
        raise BadRequest("request body must be a JSON object")
    for key, task in TASKS:
        if key in data:
            return task
    raise BadRequest("the body needs 'messages' (chat), 'prompt' (completions) or 'input' (embeddings)")


class DatabricksCompletionRequest(CompletionRequest):
    max_tokens: int | None = Field(None, ge=1)  # type: ignore[assignment]
    temperature: float = Field(1.0, ge=0, le=2)  # Databricks: a float in [0, 2]
    error_behavior: Literal["error", "truncate"] = "error"
    use_raw_prompt: bool = False


MAX_TOOLS = 32


class DatabricksChatRequest(ChatRequest):
    """The rules Databricks' chat reference states beyond OpenAI's."""

    @model_validator(mode="after")
    def _databricks_rules(self) -> DatabricksChatRequest:
        tools = self.tools or []
        if len(tools) > MAX_TOOLS:
            raise ValueError(f"at most {MAX_TOOLS} tools are supported (got {len(tools)})")
        for i, tool in enumerate(tools):
            if not tool.function.description:
                raise ValueError(f"tools[{i}].function.description is required")
        rf = self.response_format
        if rf is not None and rf.type == "json_schema":
            schema = rf.json_schema or {}
            missing = [key for key in ("name", "schema") if key not in schema]
            if missing:
                raise ValueError(f"response_format.json_schema needs {' and '.join(missing)}")
        for i, message in enumerate(self.messages):
            if message.role == "system" and i != 0:
                raise ValueError(f"messages[{i}]: the system role may appear only once, as the first message")
            if message.tool_call_id and message.role != "tool":
                raise ValueError(f"messages[{i}]: tool_call_id is allowed only on tool messages")
        return self


def parse_completion(data: dict[str, Any]) -> DatabricksCompletionRequest:
    return validated(DatabricksCompletionRequest, data)


def parse_chat(data: dict[str, Any]) -> DatabricksChatRequest:
    return validated(DatabricksChatRequest, data)


def completion_requests(
    req: DatabricksCompletionRequest, max_model_len: int, templated: list[str] | None = None
) -> list[GenerationRequest]:
    """The generation requests of a completion: ``templated`` replaces the text prompts when
    they went through the chat template. Without ``max_tokens`` a completion may run to the
    end of the context; with it and ``error_behavior: "error"``, a prompt that leaves no
    room for ``max_tokens`` is refused, while ``"truncate"`` returns what fits: a prompt longer than
    the context keeps its last ``max_model_len - 1`` tokens (TGI's ``truncate``), so at least one
    token is generated."""
    limited = req.max_tokens is not None
    sized = req.model_copy(update={"max_tokens": req.max_tokens or max_model_len})
    out = generation_requests(sized)  # type: ignore[arg-type]
    for i, gen in enumerate(out):
        if templated is not None and gen.prompt_ids is None:
            gen.prompt = templated[i]
            gen.add_special_tokens = False
        gen.fit_context = limited and req.error_behavior == "error"
        if req.error_behavior == "truncate" and gen.truncate is None:  # the prompt's end, what fits
            gen.truncate = max_model_len - 1
        gen.cap_max_new_tokens = gen.max_new_tokens_omitted = False  # MindIE's rules are not Databricks'
    return out
