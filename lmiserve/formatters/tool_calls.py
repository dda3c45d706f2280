"""Tool calls: the JSON schemas that force them, and reading them back out of model text.

``tool_choice`` ``"required"`` or a named function is enforced by constrained decoding with
the schema built here, so the output is always a valid call. With ``"auto"`` the model may
answer in prose or call tools the way its chat template taught it: ``<tool_call>{...}</tool_call>``
blocks (Hermes, Qwen), or a bare JSON object / array of ``{"name", "arguments"|"parameters"}``
(Llama 3.1 style); where a function says ``strict: true``, a tagged call's arguments are held to
its parameters by a structural tag (bare JSON calls are not constrained).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

_TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
OPEN_TAG = "<tool_call>"


@dataclass
class ToolCall:
    name: str
    arguments: str
    id: str = ""

    def __post_init__(self) -> None:
        self.id = self.id or f"call_{uuid.uuid4().hex[:24]}"

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def parameters_schema(tool: dict[str, Any]) -> dict[str, Any]:
    params = tool.get("parameters")
    return params if isinstance(params, dict) and params else {"type": "object"}


def named_schema(tool: dict[str, Any]) -> dict[str, Any]:
    """Output = the arguments of this one function."""
    return parameters_schema(tool)


def auto_strict_tag(tools: list[dict[str, Any]]) -> dict[str, Any]:
    """``tool_choice: "auto"`` with ``strict`` functions: xgrammar's structural tag. The text is free
    until the model writes ``<tool_call>``; from there the call must be one of the functions as the
    Hermes / Qwen templates write it, a strict function's arguments matching its parameters (any
    JSON object for the others)."""
    tags = [
        {
            "begin": f'{OPEN_TAG}\n{{"name": {json.dumps(t["name"])}, "arguments": ',
            "content": {
                "type": "json_schema",
                "json_schema": parameters_schema(t) if t.get("strict") else {"type": "object"},
            },
            "end": "}\n</tool_call>",
        }
        for t in tools
    ]
    return {"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": [OPEN_TAG], "tags": tags}}


def required_schema(tools: list[dict[str, Any]], parallel: bool = True) -> dict[str, Any]:
    """Output = a JSON array of one or more calls of the given functions."""
    call = {
        "anyOf": [
            {
                "type": "object",
                "properties": {"name": {"const": t["name"]}, "arguments": parameters_schema(t)},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for t in tools
        ]
    }
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": call}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def _call(obj: Any, names: set[str]) -> ToolCall | None:
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    args = obj.get("arguments", obj.get("parameters"))
    if not isinstance(name, str) or name not in names or args is None:
        return None
    return ToolCall(name, args if isinstance(args, str) else json.dumps(args, ensure_ascii=False))


def parse_forced(text: str, tools: list[dict[str, Any]], named: str | None) -> list[ToolCall]:
    """Calls from constrained output (always valid JSON by construction)."""
    if named is not None:
        return [ToolCall(named, text.strip())]
    items = json.loads(text)
    names = {t["name"] for t in tools}
    return [c for c in (_call(item, names) for item in items) if c is not None]


def parse_auto(text: str, tools: list[dict[str, Any]]) -> tuple[str | None, list[ToolCall]]:
    """``(content, calls)`` found in free model text; content is None when it was all calls."""
    names = {t["name"] for t in tools}
    tagged = _TAGGED.findall(text)
    if tagged:
        calls = []
        for block in tagged:
            try:
                call = _call(json.loads(block), names)
            except json.JSONDecodeError:
                call = None
            if call is not None:
                calls.append(call)
        if calls:
            rest = _TAGGED.sub("", text).strip()
            return (rest or None), calls
    stripped = text.strip()
    if stripped[:1] in ("{", "["):
        try:
            value = json.loads(stripped)
        except json.JSONDecodeError:
            return text, []
        items = value if isinstance(value, list) else [value]
        calls = [_call(item, names) for item in items]
        if items and all(c is not None for c in calls):
            return None, [c for c in calls if c is not None]
    return text, []


def may_become_call(text: str) -> bool:
    """Whether streamed text so far could still turn out to be a tool call (hold it back)."""
    stripped = text.lstrip()
    if not stripped:
        return True
    if stripped[0] in "{[":
        return True
    return OPEN_TAG.startswith(stripped[: len(OPEN_TAG)]) or stripped.startswith(OPEN_TAG)


def call_start(text: str) -> int | None:
    """Where, in streamed text so far, a tool call may begin (the text from there is held back):
    0 where the whole text could still be a call, else at a ``<tool_call>`` tag or at a tail that
    could grow into one; None where no call can begin."""
    if may_become_call(text):
        return 0
    i = text.find(OPEN_TAG)
    if i >= 0:
        return i
    for n in range(min(len(text), len(OPEN_TAG) - 1), 0, -1):
        if OPEN_TAG.startswith(text[-n:]):
            return len(text) - n
    return None
