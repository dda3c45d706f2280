"""A conversation rendered into a prompt with the model's own chat template."""

from __future__ import annotations

from typing import Any

from ..errors import ValidationFailed


def render_chat(
    tokenizer: Any,
    model_name: str,
    messages: list[dict],
    tools: list[dict] | None,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    template_kwargs: dict[str, Any] | None = None,
) -> str:
    """``messages`` (and ``tools``, as OpenAI function definitions) through ``tokenizer``'s chat
    template, with ``template_kwargs`` as the template's own variables (``enable_thinking``,
    ``reasoning_effort``); a model without a template, or a template that rejects the messages, is
    the request's error."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValidationFailed(f"model {model_name} has no chat template; use the completions API")
    try:
        return tokenizer.apply_chat_template(
            messages,
            tools=[{"type": "function", "function": t} for t in tools] if tools else None,
            add_generation_prompt=add_generation_prompt and not continue_final_message,
            continue_final_message=continue_final_message,
            tokenize=False,
            **(template_kwargs or {}),
        )
    except Exception as exc:  # noqa: BLE001 - a template that rejects these messages
        raise ValidationFailed(f"the chat template cannot render these messages: {exc}") from None
