"""Metrics read when ``/metrics`` is scraped: each served model's state, the API process's CPU, and
the bytes downloaded for models."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..model_fetch.progress import downloaded_bytes
from ..serving import ModelSnapshot

SPECULATIVE_COUNTERS = (
    ("spec_proposed_tokens", "Tokens proposed by speculative decoding and checked by the model."),
    ("spec_accepted_tokens", "Tokens proposed by speculative decoding that the model accepted."),
    ("spec_drafts", "Speculative proposals checked (a sequence's run of proposed tokens in one engine step)."),
)
"""The speculative decoding counters (``wire.EngineStats``' fields), exported as ``lmiserve_<field>_total``."""


class ApiCpuCollector(Collector):
    """CPU time this API process has used (user and system, every thread), read when scraped:
    with several API processes, ``/metrics`` adds theirs up. ``lmiserve bench`` divides its
    growth over a level by the tokens streamed."""

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(
            "lmiserve_api_cpu_seconds",
            "CPU seconds (user and system) used by the API process(es): HTTP, tokenizing, detokenizing and "
            "formatting; the engine and handler workers are other processes.",
            labels=["model"],
        )
        family.add_metric([""], time.process_time())  # a server-level series: no model
        yield family


class DownloadCollector(Collector):
    """Bytes this process has downloaded for models and adapters (Hub ids, ``s3://`` prefixes)."""

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(
            "lmiserve_model_download_bytes",
            "Bytes downloaded for models and adapters named by a Hugging Face Hub id or an s3:// prefix.",
            labels=["model"],
        )
        family.add_metric([""], downloaded_bytes())  # a server-level series: no model
        yield family


class ModelStateCollector(Collector):
    """Gauges and counters that mirror each served model's state, read when scraped. Models
    that have a ``metrics_snapshot()`` method take part."""

    def __init__(self, models: Any):
        self.models = models  # a ModelRegistry: ``.models`` maps names to served models

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        running = GaugeMetricFamily("lmiserve_requests_running", "Requests being processed.", labels=["model"])
        waiting = GaugeMetricFamily("lmiserve_requests_waiting", "Requests waiting to be processed.", labels=["model"])
        usage = GaugeMetricFamily(
            "lmiserve_kv_cache_usage_ratio", "Fraction of the KV-cache blocks in use (0 to 1).", labels=["model"]
        )
        used = GaugeMetricFamily("lmiserve_kv_cache_blocks_used", "KV-cache blocks in use.", labels=["model"])
        total = GaugeMetricFamily("lmiserve_kv_cache_blocks_total", "KV-cache blocks in all.", labels=["model"])
        hits = CounterMetricFamily(
            "lmiserve_prefix_cache_hit_tokens",
            "Prompt tokens whose KV entries were found in the prefix cache.",
            labels=["model"],
        )
        preemptions = CounterMetricFamily(
            "lmiserve_preemptions", "Sequences preempted to free KV-cache blocks.", labels=["model"]
        )
        steps = CounterMetricFamily(
            "lmiserve_engine_steps",
            "Engine steps by mode: replayed from a captured device graph, or run eagerly.",
            labels=["model", "mode"],
        )
        replays = CounterMetricFamily(
            "lmiserve_requests_replayed",
            "Requests handed to a restarted engine after a crash: started again from the prompt, "
            "or continued from the tokens already generated.",
            labels=["model", "how"],
        )
        poisoned = CounterMetricFamily(
            "lmiserve_requests_poisoned",
            "Requests taken for the cause of two consecutive engine crashes and ended.",
            labels=["model"],
        )
        ended = CounterMetricFamily(
            "lmiserve_requests_ended_by_engine",
            "Requests the engine ended on its own: deadline passed in the queue, out of memory in "
            "their step, NaN or inf logits.",
            labels=["model", "reason"],
        )
        speculative = {
            field: CounterMetricFamily(f"lmiserve_{field}", doc, labels=["model"])
            for field, doc in SPECULATIVE_COUNTERS
        }
        accepted_length = GaugeMetricFamily(
            "lmiserve_spec_mean_accepted_length",
            "Tokens a checked speculative proposal yields, the model's own token included: 1 + accepted / drafts "
            "(0 before the first proposal).",
            labels=["model"],
        )
        for name, model in sorted(dict(self.models.models).items()):
            snapshot_of = getattr(model, "metrics_snapshot", None)
            if snapshot_of is None:
                continue
            s: ModelSnapshot = snapshot_of()
            running.add_metric([name], s.running)
            waiting.add_metric([name], s.waiting)
            if s.kv_blocks_total is not None:
                blocks = s.kv_blocks_total
                in_use = s.kv_blocks_used or 0
                usage.add_metric([name], min(1.0, in_use / blocks) if blocks > 0 else 0.0)
                used.add_metric([name], in_use)
                total.add_metric([name], blocks)
            if s.counters is not None:
                hits.add_metric([name], s.counters.get("prefix_cache_hit_tokens", 0))
                preemptions.add_metric([name], s.counters.get("preemptions", 0))
                steps.add_metric([name, "graph"], s.counters.get("graph_steps", 0))
                steps.add_metric([name, "eager"], s.counters.get("eager_steps", 0))
                for how, key in (("prompt", "replayed"), ("continued", "resumed")):
                    replays.add_metric([name, how], s.counters.get(key, 0))
                poisoned.add_metric([name], s.counters.get("poisoned", 0))
                for reason, key in (("deadline", "expired_in_queue"), ("oom", "oom_failures")):
                    ended.add_metric([name, reason], s.counters.get(key, 0))
                ended.add_metric([name, "nonfinite"], s.counters.get("nonfinite_sequences", 0))
            if s.counters is not None and s.speculative:
                for field, family in speculative.items():
                    family.add_metric([name], s.counters.get(field, 0))
                accepted_length.add_metric([name], s.spec_mean_accepted_length)
        yield from (running, waiting, usage, used, total, hits, preemptions, steps, replays, poisoned, ended)
        yield from (*speculative.values(), accepted_length)
