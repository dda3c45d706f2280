"""What a served model reports about itself at scrape time, and engine counters that survive restarts."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .speculative_stats import mean_accepted_length

COUNTER_FIELDS = (
    "prefix_cache_hit_tokens",
    "preemptions",
    "graph_steps",
    "eager_steps",
    "expired_in_queue",
    "oom_failures",
    "nonfinite_sequences",
    "spec_proposed_tokens",
    "spec_accepted_tokens",
    "spec_drafts",
)
"""Cumulative engine statistics (``wire.EngineStats``) exported as counters."""


@dataclass
class ModelSnapshot:
    """What a model reports at scrape time. KV-cache and engine counters are None for models
    without an engine (handler workers)."""

    running: int = 0
    waiting: int = 0
    kv_blocks_used: int | None = None
    kv_blocks_total: int | None = None
    counters: dict[str, int] | None = None
    speculative: bool = False
    """The model has speculative decoding configured (its ``spec_*`` counters are exported)."""

    @property
    def spec_mean_accepted_length(self) -> float:
        """Tokens a checked speculative proposal yields, ``1 + accepted / drafts`` (0 before the first)."""
        return mean_accepted_length(self.counters or {})


class EngineCounters:
    """An engine model's cumulative counters across engine restarts.

    :meth:`engine_exited` folds the last statistics of an engine that exited into an offset;
    :meth:`totals` adds the running engine's own counts. Totals are also clamped to the largest
    value reported so far, so a counter never goes backwards even if an exit went unseen.
    """

    def __init__(self, fields: Iterable[str] = COUNTER_FIELDS):
        self.offset = dict.fromkeys(fields, 0)
        self._reported = dict.fromkeys(fields, 0)

    def engine_exited(self, stats: Any) -> None:
        """Keep the counts of an engine that is gone (its last ``EngineStats``, or None)."""
        if stats is None:
            return
        for name in self.offset:
            self.offset[name] += int(getattr(stats, name))

    def totals(self, stats: Any) -> dict[str, int]:
        """Counts of all engines so far, ``stats`` being the running engine's (or None)."""
        out = {}
        for name, base in self.offset.items():
            value = base + (int(getattr(stats, name)) if stats is not None else 0)
            value = max(value, self._reported[name])
            self._reported[name] = out[name] = value
        return out


def engine_snapshot(client: Any, counters: EngineCounters) -> ModelSnapshot:
    """A snapshot from an engine client's latest ``EngineStats`` (sent with every engine step)."""
    stats = getattr(client, "stats", None)
    if stats is None:
        info = getattr(client, "info", None) or {}
        total = int(info.get("kv_blocks", 0) or 0)
        return ModelSnapshot(kv_blocks_used=0, kv_blocks_total=total, counters=counters.totals(None))
    return ModelSnapshot(
        running=stats.running,
        waiting=stats.waiting,
        kv_blocks_used=stats.kv_blocks_used,
        kv_blocks_total=stats.kv_blocks_total,
        counters=counters.totals(stats),
    )
