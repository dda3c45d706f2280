"""Turning what a custom input formatter returns into an LMI rolling-batch request.

The formatter returns a :class:`~lmiserve.formatters.request_io.TextInput` (or a dict with
``inputs``/``prompt``/``input_text``, ``messages``, ``parameters``, ``stream``, ``adapter``, or a
plain prompt string). Its parameters are LMI's and are validated exactly as a body's would be.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from ...errors import BadRequest, LmiServeError
from ...formatters import lmi_rolling
from ...formatters.request_io import RequestInput, TextInput
from ..inputs import Input


@dataclass
class FormattedInput:
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    stream: bool | None = None
    adapter: str | None = None


def _from_dict(data: dict[str, Any]) -> FormattedInput:
    prompt = data.get("inputs", data.get("prompt", data.get("input_text")))
    return FormattedInput(
        prompt=prompt,
        messages=data.get("messages"),
        parameters=data.get("parameters") or {},
        stream=data.get("stream"),
        adapter=data.get("adapter", data.get("adapter_name")),
    )


def normalize(result: Any) -> FormattedInput:
    """What the input formatter returned, as one shape; BadRequest for anything else."""
    if isinstance(result, TextInput):
        found = FormattedInput(
            result.input_text, result.messages, dict(result.parameters), result.stream, result.adapter_name
        )
    elif isinstance(result, RequestInput):
        raise BadRequest("the input formatter returned a RequestInput without text; return a TextInput")
    elif isinstance(result, dict):
        found = _from_dict(result)
    elif isinstance(result, str):
        found = FormattedInput(prompt=result)
    else:
        raise BadRequest(f"the input formatter returned {type(result).__name__}; return a TextInput or a dict")
    if (found.prompt is None) == (found.messages is None):
        raise BadRequest("the input formatter must give exactly one of a prompt (input_text) or messages")
    if found.prompt is not None and not isinstance(found.prompt, str):
        raise BadRequest("the input formatter's prompt must be a string")
    if found.messages is not None and not isinstance(found.messages, list):
        raise BadRequest("the input formatter's messages must be a list of {role, content} objects")
    if not isinstance(found.parameters, dict):
        raise BadRequest("the input formatter's parameters must be a dict")
    if found.adapter is not None and not isinstance(found.adapter, str):
        raise BadRequest("the input formatter's adapter must be a string (an adapter's name)")
    return found


def to_request(
    found: FormattedInput, defaults: lmi_rolling.Defaults, render_chat: Callable[[list[dict[str, Any]]], str]
) -> lmi_rolling.ParsedRequest:
    """The parsed LMI request; ``render_chat`` renders messages with the model's chat template."""
    prompt = found.prompt if found.prompt is not None else render_chat(found.messages or [])
    body: dict[str, Any] = {"inputs": prompt, "parameters": found.parameters}
    if found.stream is not None:
        body["stream"] = bool(found.stream)
    if found.adapter:
        body["adapters"] = found.adapter
    parsed = lmi_rolling.parse_request(orjson.dumps(body), defaults)
    if found.messages is not None:
        parsed.generation.add_special_tokens = False  # the chat template has them
    return parsed


def parse_custom(
    input_formatter: Callable[..., Any],
    body: bytes,
    properties: dict[str, str],
    defaults: lmi_rolling.Defaults,
    render_chat: Callable[[list[dict[str, Any]]], str],
) -> lmi_rolling.ParsedRequest:
    """The request ``input_formatter`` makes of a body (given as DJL's ``Input``); a formatter
    that raises refuses the body (400)."""
    try:
        result = input_formatter(Input(properties, [("data", body)]))
    except LmiServeError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's input formatter refused the body
        name = getattr(input_formatter, "__name__", "input_formatter")
        raise BadRequest(f"input formatter {name} failed: {type(exc).__name__}: {exc}") from None
    return to_request(normalize(result), defaults, render_chat)
