"""Speculative decoding's figures for a bench run: the server's counters (its model description's
``speculative`` object, read before and after) give the run's own proposals and acceptances, and
a cost model what they should buy.

- acceptance rate ``a = accepted / proposed``;
- mean accepted length ``L = 1 + accepted / drafts``: tokens a checked proposal yields, the
  model's own token included (a step without speculation yields 1);
- mean proposal length ``k = proposed / drafts``;
- predicted speed-up over not speculating ``L / (1 + k c)``, where ``c`` is the server's
  ``draft_cost_ratio`` (proposing one token, as a share of one step of the model; 0 for n-gram):
  a step that checks ``k`` proposed tokens is taken to cost what a plain step does, plus ``k c``;
- for comparison with the measured ``L``, the tokens a step yields when every proposed token is
  accepted independently with probability ``a`` (Leviathan et al., 2023):
  ``(1 - a^(k+1)) / (1 - a)``.
"""

from __future__ import annotations

import math
from typing import Any

COUNTERS = ("proposed_tokens", "accepted_tokens", "drafts")
STATIC = ("method", "num_speculative_tokens", "draft_cost_ratio")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return value


def speculative_stats(description: Any) -> dict[str, Any] | None:
    """The ``speculative`` object of a model description (``GET /models/{name}``'s element, at
    its top level or under ``engine``), with its counters as numbers; None where there is none
    or it has no counters."""
    if not isinstance(description, dict):
        return None
    found = description.get("speculative")
    engine = description.get("engine")
    if not isinstance(found, dict) and isinstance(engine, dict):
        found = engine.get("speculative")
    if not isinstance(found, dict):
        return None
    stats: dict[str, Any] = {key: found[key] for key in ("method",) if isinstance(found.get(key), str)}
    for key in (*COUNTERS, "num_speculative_tokens", "draft_cost_ratio", "mean_accepted_length", "acceptance_rate"):
        if (value := _number(found.get(key))) is not None:
            stats[key] = value
    return stats if all(key in stats for key in COUNTERS) else None


def iid_tokens_per_step(a: float, k: float) -> float:
    """Expected tokens per step when each of ``k`` proposed tokens is accepted independently with
    probability ``a`` until the first rejection, plus the model's own token: ``(1 - a^(k+1)) / (1 - a)``."""
    if a >= 1.0:
        return k + 1.0
    return (1.0 - a ** (k + 1.0)) / (1.0 - a)


def predicted_speedup(mean_accepted_length: float, k: float, cost_ratio: float) -> float:
    """Tokens per unit of time against plain decoding: ``L / (1 + k c)``."""
    return mean_accepted_length / (1.0 + k * cost_ratio)


def run_figures(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any] | None:
    """The run's figures from the counters before and after it; None where either read had none
    (another server, speculation off). A counter that went down (the engine restarted) makes the
    after-read the run's own count."""
    if before is None or after is None:
        return None
    delta = {key: after[key] - before[key] for key in COUNTERS}
    if any(value < 0 for value in delta.values()):
        delta = {key: after[key] for key in COUNTERS}
    proposed, accepted, drafts = (delta[key] for key in COUNTERS)
    figures: dict[str, Any] = {key: after[key] for key in STATIC if key in after}
    figures.update(proposed_tokens=proposed, accepted_tokens=accepted, drafts=drafts)
    if drafts <= 0 or proposed <= 0:
        return figures
    a = accepted / proposed
    k = proposed / drafts
    length = 1.0 + accepted / drafts
    c = float(after.get("draft_cost_ratio") or 0.0)
    figures.update(
        acceptance_rate=round(a, 4),
        mean_accepted_length=round(length, 4),
        mean_proposal_length=round(k, 4),
        draft_cost_ratio=c,
        predicted_speedup=round(predicted_speedup(length, k, c), 4),
        iid_tokens_per_step=round(iid_tokens_per_step(a, k), 4),
    )
    return figures


def table(rows: list[dict[str, Any]]) -> str:
    """The speculative figures per concurrency level ("" where no level has any)."""
    if not any(row.get("speculative") for row in rows):
        return ""
    lines = [
        "| concurrency | method | proposals checked | acceptance a | mean accepted length L | mean proposal k "
        "| cost ratio c | predicted speed-up L/(1+kc) | i.i.d. tokens/step |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        s = row.get("speculative")
        if not s:
            continue
        if "acceptance_rate" not in s:
            lines.append(f"| {row['concurrency']} | {s.get('method', '-')} | {s['drafts']} | - | - | - | - | - | - |")
            continue
        lines.append(
            f"| {row['concurrency']} | {s.get('method', '-')} | {s['drafts']} | {s['acceptance_rate']:.3f} "
            f"| {s['mean_accepted_length']:.2f} | {s['mean_proposal_length']:.2f} | {s['draft_cost_ratio']:.3g} "
            f"| {s['predicted_speedup']:.2f}x | {s['iid_tokens_per_step']:.2f} |"
        )
    return "\n".join(lines)
