"""Speculative decoding's settings: ``option.speculative_config`` (vLLM's JSON) and LMI's older
``option.speculative_draft_model``, read into one plain description for our engine.

The JSON keeps vLLM's names and defaults, so a configuration written for vLLM means the same here
(and is passed to vLLM unchanged on its backend):

- ``method``: ``ngram`` (prompt lookup, no weights), ``draft_model``, ``eagle`` or ``eagle3``. When
  it is left out, a ``model`` makes it ``eagle3`` or ``eagle`` where the model's name says so, else
  ``draft_model``; with no ``model`` it is ``ngram``.
- ``num_speculative_tokens``: tokens proposed per step (required, above 0).
- ``prompt_lookup_min`` / ``prompt_lookup_max`` (``ngram``): the shortest and longest suffix matched
  against the earlier text. Both unset: 5 and 5; one unset: the other's value.
- ``model``: the draft model or EAGLE head (a directory, a Hub id or ``s3://``).

lmiserve's own keys, which vLLM does not read and which are dropped before the JSON reaches it:
``adaptive`` (default true: a sequence whose proposals are rarely accepted stops proposing for a
while, and large batches propose less).

Plain Python: no torch, nothing above the config layer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

METHODS = ("ngram", "draft_model", "eagle", "eagle3")
OWN_KEYS = frozenset({"adaptive"})
"""Keys lmiserve reads and vLLM does not."""
_KNOWN = frozenset({"method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "model", *OWN_KEYS})


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int = 0
    prompt_lookup_max: int = 0
    model: str | None = None
    adaptive: bool = True
    raw: dict[str, Any] = field(default_factory=dict, compare=False)
    """The JSON as given (vLLM's backend takes it, less :data:`OWN_KEYS`)."""

    @property
    def needs_model(self) -> bool:
        return self.method != "ngram"

    def for_vllm(self) -> dict[str, Any]:
        """The configuration as vLLM reads it."""
        return {k: v for k, v in self.raw.items() if k not in OWN_KEYS}


def _positive_int(raw: dict[str, Any], key: str, required: bool = False) -> int | None:
    value = raw.get(key)
    if value is None:
        if required:
            raise ValueError(f"speculative_config: {key} is required")
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"speculative_config: {key} must be an integer of at least 1, got {value!r}")
    return value


def _method(raw: dict[str, Any]) -> str:
    method = raw.get("method")
    model = raw.get("model")
    if method is None:
        if model is None:
            return "ngram"
        name = str(model).lower()
        return "eagle3" if "eagle3" in name else "eagle" if "eagle" in name else "draft_model"
    if method not in METHODS:
        raise ValueError(f"speculative_config: method must be one of {', '.join(METHODS)}, got {method!r}")
    return str(method)


def parse_speculative(text: str | dict[str, Any] | None, draft_model: str | None = None) -> SpeculativeConfig | None:
    """The configuration from ``option.speculative_config`` (JSON text or a mapping) and
    ``option.speculative_draft_model``; None when neither is set. ValueError names what is wrong."""
    if text in (None, "") and not draft_model:
        return None
    raw: dict[str, Any]
    if isinstance(text, dict):
        raw = dict(text)
    elif text in (None, ""):
        raw = {}
    else:
        try:
            raw = json.loads(str(text))
        except json.JSONDecodeError as exc:
            raise ValueError(f"speculative_config is not JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise ValueError("speculative_config must be a JSON object")
    if draft_model:
        if raw.get("model") not in (None, draft_model):
            raise ValueError("speculative_draft_model and speculative_config.model name different models")
        raw.setdefault("model", draft_model)
        raw.setdefault("num_speculative_tokens", 5)
    method = _method(raw)
    k = _positive_int(raw, "num_speculative_tokens", required=True)
    adaptive = raw.get("adaptive", True)
    if not isinstance(adaptive, bool):
        raise ValueError(f"speculative_config: adaptive must be true or false, got {adaptive!r}")
    lo = hi = 0
    if method == "ngram":
        lo_set, hi_set = _positive_int(raw, "prompt_lookup_min"), _positive_int(raw, "prompt_lookup_max")
        if lo_set is None and hi_set is None:
            lo = hi = 5
        else:
            lo, hi = lo_set or hi_set or 5, hi_set or lo_set or 5
        if lo > hi:
            raise ValueError(f"speculative_config: prompt_lookup_min={lo} must be <= prompt_lookup_max={hi}")
    elif not raw.get("model"):
        raise ValueError(f"speculative_config: method {method} needs a model")
    return SpeculativeConfig(
        method=method,
        num_speculative_tokens=k,  # type: ignore[arg-type]
        prompt_lookup_min=lo,
        prompt_lookup_max=hi,
        model=raw.get("model"),
        adaptive=adaptive,
        raw=raw,
    )


def unknown_keys(raw: dict[str, Any]) -> list[str]:
    """Keys our engine does not read (vLLM's backend may): reported, not refused."""
    return sorted(k for k in raw if k not in _KNOWN)
