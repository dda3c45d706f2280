"""OpenAI ``/v1/responses``: the conversation's items as chat messages.

``input`` is a string (one user message) or a list of items: messages (role ``user``, ``system``,
``developer`` or ``assistant``; content a string or ``input_text`` / ``output_text`` /
``refusal`` / ``input_image`` parts), ``function_call`` items (the model's calls, given back),
``function_call_output`` items (their results) and ``reasoning`` items (given back, and left out
of the prompt, as a chat template leaves out earlier turns' reasoning). Calls join the assistant
message before them (one turn: its text and its calls); a result is a ``tool`` message naming its
call's id.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import ValidationFailed

ROLES = ("user", "system", "developer", "assistant")
TEXT_PARTS = ("input_text", "output_text")


def input_items(value: str | list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The request's ``input`` as a list of items (a string is one user message)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    return list(value)


def _part(part: Any, where: str) -> dict[str, Any]:
    """A content part as chat reads it."""
    kind = part.get("type") if isinstance(part, dict) else None
    if kind in TEXT_PARTS:
        if not isinstance(part.get("text"), str):
            raise ValidationFailed(f"{where}: an {kind} part needs 'text'")
        return {"type": "text", "text": part["text"]}
    if kind == "refusal":
        return {"type": "text", "text": str(part.get("refusal") or "")}
    if kind == "input_image":
        url = part.get("image_url")
        if not isinstance(url, str) or not url:
            raise ValidationFailed(f"{where}: only input_image parts with an 'image_url' are supported")
        return {"type": "image_url", "image_url": {"url": url}}
    raise ValidationFailed(
        f"{where}: content parts of type {kind!r} are not supported "
        "(input_text, output_text, refusal and input_image are)"
    )


def _content(content: Any, where: str) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ValidationFailed(f"{where}.content must be a string or a list of content parts")
    parts = [_part(p, f"{where}.content[{j}]") for j, p in enumerate(content)]
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def _output_text(output: Any, where: str) -> str:
    """A function call's result as the text of a tool message."""
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        parts = [_part(p, f"{where}.output[{j}]") for j, p in enumerate(output)]
        if any(p["type"] != "text" for p in parts):
            raise ValidationFailed(f"{where}.output: only text parts are supported in a function call's output")
        return "".join(p["text"] for p in parts)
    raise ValidationFailed(f"{where}.output must be a string or a list of content parts")


def _required(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise ValidationFailed(f"{where}: a {item.get('type')} item needs {key!r} (a string)")
    return value


def _call(item: dict[str, Any], where: str) -> dict[str, Any]:
    arguments = _required(item, "arguments", where)
    try:
        json.loads(arguments)
    except json.JSONDecodeError:
        raise ValidationFailed(f"{where}.arguments is not JSON") from None
    return {
        "id": _required(item, "call_id", where),
        "type": "function",
        "function": {"name": _required(item, "name", where), "arguments": arguments},
    }


def chat_messages(items: list[dict[str, Any]], instructions: str | None = None) -> list[dict[str, Any]]:
    """The conversation ``items`` (after ``instructions``, a system message) as chat messages."""
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    names: dict[str, str] = {}
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise ValidationFailed(f"{where} must be an object")
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ROLES:
                raise ValidationFailed(f"{where}.role must be one of {', '.join(ROLES)} (got {role!r})")
            messages.append({"role": role, "content": _content(item.get("content"), where)})
        elif kind == "function_call":
            call = _call(item, where)
            names[call["id"]] = call["function"]["name"]
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id = _required(item, "call_id", where)
            message = {"role": "tool", "tool_call_id": call_id, "content": _output_text(item.get("output"), where)}
            if call_id in names:
                message["name"] = names[call_id]
            messages.append(message)
        elif kind == "reasoning":
            continue
        else:
            raise ValidationFailed(
                f"{where}: items of type {kind!r} are not supported "
                "(message, function_call, function_call_output and reasoning are)"
            )
    if not messages:
        raise ValidationFailed("input: the conversation holds no message")
    return messages
