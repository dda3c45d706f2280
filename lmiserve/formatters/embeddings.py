"""Embedding requests and responses: OpenAI / Databricks ``{"input": ...}`` and LMI ``{"inputs": ...}``.

OpenAI and Databricks answer ``{"object": "list", "data": [{"object": "embedding", "index",
"embedding"}], "model", "usage"}`` (vectors as floats, or base64 of little-endian float32 when
``encoding_format`` is ``base64``); the LMI shape answers the list of vectors.
"""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..errors import BadRequest, ValidationFailed
from .validation import non_empty, validated

MAX_INPUTS = 2048


class OpenAiEmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    input: str | list[str] | list[int] | list[list[int]]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    instruction: str | None = None
    user: str | None = None

    @field_validator("input")
    @classmethod
    def _non_empty(cls, v: Any) -> Any:
        return non_empty(v, "input must hold at least one text", most=MAX_INPUTS)


@dataclass
class EmbeddingRequest:
    texts: list[str] | None
    token_ids: list[list[int]] | None
    shape: str  # openai | lmi
    model: str | None = None
    encoding_format: str = "float"
    dimensions: int | None = None
    with_id: bool = False

    @property
    def count(self) -> int:
        return len(self.texts if self.texts is not None else self.token_ids or [])


def parse(data: Any) -> EmbeddingRequest:
    if not isinstance(data, dict):
        raise BadRequest("request body must be a JSON object with 'input' or 'inputs'")
    if "input" in data:
        req = validated(OpenAiEmbeddingRequest, data)
        value = req.input
        texts: list[str] | None = None
        ids: list[list[int]] | None = None
        if isinstance(value, str):
            texts = [value]
        elif all(isinstance(x, str) for x in value):
            texts = list(value)  # type: ignore[arg-type]
        elif all(isinstance(x, int) for x in value):
            ids = [list(value)]  # type: ignore[arg-type]
        else:
            ids = [list(x) for x in value]  # type: ignore[union-attr]
        if texts is not None and req.instruction:
            prefix = req.instruction if req.instruction[-1:].isspace() else req.instruction + " "
            texts = [prefix + t for t in texts]
        return EmbeddingRequest(
            texts, ids, "openai", req.model, req.encoding_format, req.dimensions, bool(data.get("_with_id"))
        )
    if "inputs" in data:
        inputs = data["inputs"]
        if isinstance(inputs, str):
            inputs = [inputs]
        if not isinstance(inputs, list) or not inputs or not all(isinstance(x, str) for x in inputs):
            raise ValidationFailed("inputs must be a string or a non-empty list of strings")
        return EmbeddingRequest(list(inputs), None, "lmi")
    raise BadRequest("request body has no 'input' (or 'inputs')")


def _encode(vector: np.ndarray, encoding_format: str) -> Any:
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.astype(np.float32).tolist()


def response(req: EmbeddingRequest, vectors: np.ndarray, token_counts: list[int], model: str) -> Any:
    if req.shape == "lmi":
        return vectors.astype(np.float32).tolist()
    tokens = int(sum(token_counts))
    body: dict[str, Any] = {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": _encode(v, req.encoding_format)}
            for i, v in enumerate(vectors)
        ],
        "model": req.model or model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    if req.with_id:
        body = {"id": f"emb-{uuid.uuid4().hex}", **body}
    return body
