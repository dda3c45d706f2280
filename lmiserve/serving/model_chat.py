"""A served model's chat: the conversation rendered with its chat template, and the reasoning
parser its answers go through (``option.reasoning_parser``, ``option.enable_reasoning``). Engine
and handler models share these."""

from __future__ import annotations

import logging
from typing import Any

from ..errors import ModelNotReady
from ..generation import reasoning
from ..generation.chat_template import render_chat

log = logging.getLogger("lmiserve.serving")


def chosen_parser(model: Any) -> str | None:
    """The model's parser: the one its settings name, ``auto``'s pick from its chat template and
    tokens, or None (reasoning off). Decided once, when first asked (the tokenizer is loaded)."""
    if "_reasoning_parser" in model.__dict__:
        return model.__dict__["_reasoning_parser"]
    cfg = model.settings.model
    name = None if cfg.enable_reasoning is False else cfg.reasoning_parser or ("auto" if cfg.enable_reasoning else None)
    if name == "auto" and model.tokenizer is not None:
        tokenizer = model.tokenizer
        name = reasoning.detect(getattr(tokenizer, "chat_template", None), tokenizer.get_vocab())
        log.info("model %s: reasoning parser %s", model.name, name or "none (no known thinking markers)")
    if model.tokenizer is not None:
        model.__dict__["_reasoning_parser"] = name
    return name


def chat_prompt(
    model: Any,
    messages: list[dict],
    tools: list[dict] | None,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    template_kwargs: dict[str, Any] | None = None,
) -> str:
    """The conversation rendered with the model's chat template."""
    if model.tokenizer is None:
        raise ModelNotReady(f"model {model.name} is not ready")
    media = getattr(model, "media", None)
    if media is not None:
        media.check_messages(messages)
    return render_chat(
        model.tokenizer, model.name, messages, tools, add_generation_prompt, continue_final_message, template_kwargs
    )


def token_id(model: Any, text: str) -> int | None:
    """The id of the token that is ``text`` in the model's vocabulary (None: no such token)."""
    ids = model.__dict__.setdefault("_token_ids", {})
    if text not in ids:
        ids[text] = model.tokenizer.get_vocab().get(text)
    return ids[text]


def leave_out_thinking(model: Any, request: Any) -> None:
    """With ``option.strip_reasoning``, a request whose protocol has no field for a reasoning
    model's thinking (any but chat) gets its text without it."""
    if model.settings.model.strip_reasoning and not request.chat and request.drop_thinking is None:
        request.drop_thinking = chosen_parser(model)
