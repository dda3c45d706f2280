"""Where a model id says a model is: a Hugging Face Hub repository, an S3 prefix, or neither (a
local path or a package file, which need no fetching)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+?)(?::(?P<quant>[A-Za-z0-9_]+))?$")
"""``org/name``, optionally ``:QUANT`` (a GGUF repository's quantization, as llama.cpp and Ollama
name them)."""


@dataclass(frozen=True)
class HubRef:
    repo_id: str
    quant: str | None = None


@dataclass(frozen=True)
class S3Ref:
    bucket: str
    key: str
    """The prefix (or one object's key) under the bucket."""

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.key}"


def parse(model_id: str | None, base: Path | None = None) -> HubRef | S3Ref | None:
    """What ``model_id`` names, where it must be fetched; None for a local path (an existing path,
    also relative to ``base``), a ``pkg://`` file or nothing."""
    if not model_id or model_id.startswith("pkg://"):
        return None
    if model_id.startswith("s3://"):
        bucket, _, key = model_id[len("s3://") :].partition("/")
        return S3Ref(bucket, key)
    if model_id.startswith(("/", ".", "~", "file:")) or Path(model_id).exists():
        return None
    if base is not None and (base / model_id).exists():
        return None
    match = HUB_ID.match(model_id)
    if match is None or ".." in model_id:
        return None
    return HubRef(match["repo"], match["quant"])
