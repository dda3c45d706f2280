"""Which protocol a body on ``/invocations`` speaks, by its shape.

``inputs`` holding tensor objects is a KServe V2 inference request; other ``inputs`` are LMI
(or TGI, the same schema); ``messages`` is a chat completion, ``prompt`` a completion and
``input`` an embedding request. Anything else is left to the LMI parser, which says what is
missing.
"""

from __future__ import annotations

from typing import Any, Literal

import orjson

from ..errors import BadRequest

Shape = Literal["lmi", "kserve", "chat", "completions", "embeddings"]


class Undecodable:
    """What :func:`decode` gives for a body that is not JSON (each parser says so in its words)."""

    def __repr__(self) -> str:
        return "UNDECODABLE"


UNDECODABLE: Any = Undecodable()


def decode(body: bytes) -> Any:
    """The body's JSON value, decoded once for the shape and the parser; :data:`UNDECODABLE`
    when it is empty or not JSON."""
    try:
        return orjson.loads(body) if body else UNDECODABLE
    except orjson.JSONDecodeError:
        return UNDECODABLE


def json_object(body: bytes, data: Any = UNDECODABLE, what: str = "a JSON object") -> dict[str, Any]:
    """The body as a JSON object (``data``: the body already decoded, where the caller has it);
    :class:`BadRequest` when it is not JSON or not ``what``."""
    if data is UNDECODABLE:
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise BadRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadRequest(f"request body must be {what}")
    return data


def lmi_object(body: bytes, data: Any = UNDECODABLE) -> dict[str, Any]:
    """An LMI body: a JSON object with ``inputs`` and, if any, a ``parameters`` object."""
    data = json_object(body, data, "a JSON object with 'inputs'")
    if "inputs" not in data:
        raise BadRequest("request body has no 'inputs'")
    if data.get("parameters") is not None and not isinstance(data["parameters"], dict):
        raise BadRequest("'parameters' must be a JSON object")
    return data


def _is_tensor(x: Any) -> bool:
    return isinstance(x, dict) and "name" in x and "datatype" in x


def invocation_shape(data: Any) -> Shape:
    if not isinstance(data, dict):
        return "lmi"
    inputs = data.get("inputs")
    if isinstance(inputs, list) and inputs and all(_is_tensor(x) for x in inputs):
        return "kserve"
    if "inputs" in data:
        return "lmi"
    if "messages" in data:
        return "chat"
    if "prompt" in data:
        return "completions"
    if "input" in data:
        return "embeddings"
    return "lmi"
