"""Speculative decoding's figures for a served model: the engine's counts of proposed, accepted and
checked proposals (``spec_*`` in ``wire.EngineStats``, summed across engine restarts) read as the
mean accepted length and the acceptance rate, for ``GET /models/{name}`` and ``/metrics``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..config.speculative import SpeculativeConfig


def configured(settings: Any) -> SpeculativeConfig | None:
    """The model's speculative decoding (``option.speculative_config`` and LMI's names); None: off
    (also for settings without an engine area)."""
    engine = getattr(settings, "engine", None)
    return engine.speculative if engine is not None else None


def mean_accepted_length(counters: Mapping[str, int]) -> float:
    """Tokens a checked proposal yields, the model's own token included: ``1 + accepted / drafts``
    (0 before the first proposal is checked)."""
    drafts = counters.get("spec_drafts", 0)
    return 1 + counters.get("spec_accepted_tokens", 0) / drafts if drafts else 0.0


def acceptance_rate(counters: Mapping[str, int]) -> float:
    """The share of proposed tokens the model accepted (0 before any is proposed)."""
    proposed = counters.get("spec_proposed_tokens", 0)
    return counters.get("spec_accepted_tokens", 0) / proposed if proposed else 0.0


def describe_speculative(
    spec: SpeculativeConfig | None, counters: Mapping[str, int] | None, info: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """The ``speculative`` object of a model's description; None where it is not configured.
    ``info`` is the engine's ready information: its ``spec_cost_ratio`` (what a proposal costs
    beside a step of the model; 0 for ngram) is passed on as ``draft_cost_ratio``."""
    if spec is None:
        return None
    counts = counters or {}
    described: dict[str, Any] = {
        "method": spec.method,
        "num_speculative_tokens": spec.num_speculative_tokens,
        "proposed_tokens": counts.get("spec_proposed_tokens", 0),
        "accepted_tokens": counts.get("spec_accepted_tokens", 0),
        "drafts": counts.get("spec_drafts", 0),
        "mean_accepted_length": mean_accepted_length(counts),
        "acceptance_rate": acceptance_rate(counts),
    }
    ratio = (info or {}).get("spec_cost_ratio")
    if ratio is not None:
        described["draft_cost_ratio"] = float(ratio)
    return described
