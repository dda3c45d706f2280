"""vLLM's ``POST /tokenize`` and ``POST /detokenize`` bodies (TGI's ``/tokenize`` is in :mod:`.tgi`).

``/tokenize`` takes a ``prompt`` (special tokens added unless ``add_special_tokens`` is false), or
chat ``messages`` rendered with the model's chat template (``add_generation_prompt`` true,
``continue_final_message`` false, ``add_special_tokens`` false, ``tools`` and
``chat_template_kwargs`` as on the chat route); it answers ``{"count", "max_model_len", "tokens",
"token_strs"}``, the token strings only when ``return_token_strs`` asks for them. ``/detokenize``
takes ``tokens`` and answers ``{"prompt"}``; an id outside the vocabulary is refused.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, model_validator

from ..errors import ValidationFailed
from . import json_wire
from .openai_chat import ChatMessage, Tool
from .validation import validated

MAX_TOKEN_ID = 2**63 - 1


class TokenizePrompt(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    model: str | None = None
    prompt: StrictStr
    add_special_tokens: StrictBool = True
    return_token_strs: StrictBool | None = False


class TokenizeChat(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    model: str | None = None
    messages: list[ChatMessage]
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    add_special_tokens: StrictBool = False
    return_token_strs: StrictBool | None = False
    tools: list[Tool] | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _generation_prompt(cls, data: Any) -> Any:
        # as vLLM: both set in the body (the generation prompt's default does not count)
        if isinstance(data, dict) and data.get("continue_final_message") and data.get("add_generation_prompt"):
            raise ValueError("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
        return data

    def template_messages(self) -> list[dict[str, Any]]:
        return [m.template_dict() for m in self.messages]

    @property
    def tool_dicts(self) -> list[dict[str, Any]] | None:
        return [t.function.model_dump(exclude_none=True) for t in self.tools] if self.tools else None


class Detokenize(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    model: str | None = None
    tokens: list[Annotated[int, Field(ge=0, le=MAX_TOKEN_ID)]]


def is_vllm_tokenize(data: Any) -> bool:
    """Whether a ``/tokenize`` body is vLLM's (``prompt`` or ``messages``) rather than TGI's (``inputs``)."""
    return isinstance(data, dict) and "inputs" not in data and ("prompt" in data or "messages" in data)


def parse_tokenize(data: dict[str, Any]) -> TokenizePrompt | TokenizeChat:
    if "messages" in data:
        return validated(TokenizeChat, data)
    return validated(TokenizePrompt, data)


def parse_detokenize(data: Any) -> Detokenize:
    if not isinstance(data, dict) or "tokens" not in data:
        raise ValidationFailed('the body must be {"tokens": [ids]}')
    return validated(Detokenize, data)


def check_ids(ids: list[int], vocab_size: int) -> None:
    """Refuse a token id outside ``[0, vocab_size)``, as vLLM words it."""
    if ids and (min(ids) < 0 or max(ids) >= vocab_size):
        bad = min(ids) if min(ids) < 0 else max(ids)
        err = ValidationFailed(f"Token id {bad} is out of vocabulary")
        err.param = "tokens"  # type: ignore[attr-defined]
        raise err


def tokenize_body(ids: list[int], max_model_len: int, token_strs: list[str] | None) -> bytes:
    return json_wire.dumps({"count": len(ids), "max_model_len": max_model_len, "tokens": ids, "token_strs": token_strs})


def detokenize_body(text: str) -> bytes:
    return json_wire.dumps({"prompt": text})
