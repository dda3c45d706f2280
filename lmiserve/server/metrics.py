"""Prometheus metrics of the server: HTTP requests, generation latency and token counts, model state.

Everything lives in a :class:`ServerMetrics` the app owns (its own ``CollectorRegistry``), so
several apps in one process never share a series. Three sources feed it:

- the HTTP middleware: every request, by route template and status;
- the generation code: one :class:`GenerationObserver` per HTTP request sees each output update
  (time to first token, inter-token latency, end-to-end latency, queue time, token counts);
- :class:`~.metrics_collectors.ModelStateCollector`, at scrape time: each model's :class:`ModelSnapshot` (running and
  waiting requests, KV-cache blocks, engine counters).

The engine's counters are cumulative inside the engine process, which starts again from zero when
a crashed engine is restarted; :class:`EngineCounters` keeps what the exited engines counted as an
offset, so the exported counters never go backwards.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from ..generation.request import RequestOutput
from .metrics_collectors import ApiCpuCollector, DownloadCollector, ModelStateCollector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The Prometheus text exposition format."""

UNMATCHED_ROUTE = "unmatched"
STATE_KEY = "served_model"
"""Key in the ASGI scope's ``state`` under which the generation code records the model that served a request."""

REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
FIRST_TOKEN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.4, 0.7, 1.0, 1.5, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)
TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0)


# --- per-request generation metrics ----------------------------------------------------


@dataclass
class _ModelSeries:
    """One model's children of the generation metrics (label lookups done once)."""

    ttft: Any
    itl: Any
    e2e: Any
    queue: Any
    prompt_tokens: Any
    generation_tokens: Any
    success: Any  # the labelled parent: children by finish reason
    adapter_requests: Any  # labelled parents: children by adapter
    adapter_prompt_tokens: Any
    adapter_generation_tokens: Any
    refused: Any  # the labelled parent: children by reason


@dataclass
class _Progress:
    tokens: int = 0
    first_seen: bool = False
    done: bool = False
    last_token_at: dict[int, float] = field(default_factory=dict)


class GenerationObserver:
    """Sees every update of one HTTP request's generations, in the order they are consumed."""

    def __init__(self, model: str, series: _ModelSeries):
        self.model = model
        self._series = series
        self._progress: dict[str, _Progress] = {}

    def on_update(self, out: RequestOutput) -> None:
        p = self._progress.setdefault(out.request_id, _Progress())
        if p.done:
            return
        s = self._series
        now = time.monotonic()
        if out.first_token_at is not None and not p.first_seen and out.error is None:
            p.first_seen = True
            s.ttft.observe(max(0.0, out.first_token_at - out.arrival))
            s.prompt_tokens.inc(len(out.prompt_token_ids))
            if out.adapter:
                s.adapter_prompt_tokens.labels(self.model, out.adapter).inc(len(out.prompt_token_ids))
        generated = out.generated_tokens
        if generated > p.tokens:
            s.generation_tokens.inc(generated - p.tokens)
            if out.adapter:
                s.adapter_generation_tokens.labels(self.model, out.adapter).inc(generated - p.tokens)
            p.tokens = generated
            previous = p.last_token_at.get(out.last_index)
            if previous is not None:
                s.itl.observe(now - previous)
            p.last_token_at[out.last_index] = now
        if out.finished:
            p.done = True
            self._finished(out)

    def refused(self, reason: str) -> None:
        """The request was refused before it reached the engine (503 with Retry-After)."""
        self._series.refused.labels(self.model, reason).inc()

    def _finished(self, out: RequestOutput) -> None:
        s = self._series
        if out.adapter:
            s.adapter_requests.labels(self.model, out.adapter).inc()
        if out.error is not None:
            s.success.labels(self.model, "error").inc()
            return
        if out.finished_at is not None:
            s.e2e.observe(max(0.0, out.finished_at - out.arrival))
        if out.queue_us:
            s.queue.observe(out.queue_us[0] / 1e6)
        best = out.ranked()[0] if out.sequences else None
        reason = (best.finish_reason if best is not None else None) or "unknown"
        s.success.labels(self.model, reason).inc()

    def close(self, outs: Iterable[RequestOutput], failed: bool = False) -> None:
        """The HTTP request is over: generations that did not finish failed (the engine went
        away) or were aborted (the client went away)."""
        reason = "error" if failed else "abort"
        for out in outs:
            p = self._progress.setdefault(out.request_id, _Progress())
            if not p.done:
                p.done = True
                self._series.success.labels(self.model, reason).inc()
                if out.adapter:
                    self._series.adapter_requests.labels(self.model, out.adapter).inc()


# --- the app's metrics -----------------------------------------------------------------


class ServerMetrics:
    """The app's Prometheus registry and every metric in it."""

    def __init__(self, models: Any):
        self.models = models
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "lmiserve_requests",
            "HTTP requests by model, route template and status code.",
            ["model", "route", "status"],
            registry=r,
        )
        self.request_duration = Histogram(
            "lmiserve_request_duration_seconds",
            "HTTP request duration, to the last byte of the response.",
            ["model", "route"],
            buckets=REQUEST_BUCKETS,
            registry=r,
        )
        model = ["model"]
        self.ttft = Histogram(
            "lmiserve_time_to_first_token_seconds",
            "Time from a generation request's arrival to its first token.",
            model,
            buckets=FIRST_TOKEN_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "lmiserve_inter_token_latency_seconds",
            "Time between consecutive token updates of a sequence.",
            model,
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "lmiserve_e2e_request_latency_seconds",
            "Time from a generation request's arrival to its last token.",
            model,
            buckets=E2E_BUCKETS,
            registry=r,
        )
        self.queue_time = Histogram(
            "lmiserve_queue_time_seconds",
            "Time a generation request waited before its first engine step.",
            model,
            buckets=FIRST_TOKEN_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter("lmiserve_prompt_tokens", "Prompt tokens processed.", model, registry=r)
        self.generation_tokens = Counter("lmiserve_generation_tokens", "Tokens generated.", model, registry=r)
        self.request_success = Counter(
            "lmiserve_request_success",
            "Generation requests that ended, by finish reason (error and abort included).",
            ["model", "finish_reason"],
            registry=r,
        )
        self.requests_refused = Counter(
            "lmiserve_requests_refused",
            "Generation requests refused with 503 and Retry-After before reaching the engine, by reason: "
            "queue_full (max_rolling_batch_size + job_queue_size in flight), predicted_delay (predicted to "
            "end after the request's deadline, or to make an admitted request miss its own) or "
            "first_token_wait (first token predicted later than option.max_first_token_wait).",
            ["model", "reason"],
            registry=r,
        )
        by_adapter = ["model", "adapter"]
        self.adapter_requests = Counter(
            "lmiserve_adapter_requests",
            "Generation requests that used a LoRA adapter, by adapter.",
            by_adapter,
            registry=r,
        )
        self.adapter_prompt_tokens = Counter(
            "lmiserve_adapter_prompt_tokens", "Prompt tokens of requests using a LoRA adapter.", by_adapter, registry=r
        )
        self.adapter_generation_tokens = Counter(
            "lmiserve_adapter_generation_tokens", "Tokens generated with a LoRA adapter.", by_adapter, registry=r
        )
        r.register(ModelStateCollector(models))
        r.register(ApiCpuCollector())
        r.register(DownloadCollector())
        self._series: dict[str, _ModelSeries] = {}

    def expose(self) -> bytes:
        """The text exposition, without the ``_created`` timestamps prometheus_client adds.
        Generation series of every engine model are there from the start, at zero."""
        for name, model in list(self.models.models.items()):
            if getattr(model, "kind", None) == "engine":
                self._model_series(name)
        return generate_latest(_WithoutCreated(self.registry))

    def observer(self, model: str) -> GenerationObserver:
        return GenerationObserver(model, self._model_series(model))

    def _model_series(self, model: str) -> _ModelSeries:
        series = self._series.get(model)
        if series is None:
            series = self._series[model] = _ModelSeries(
                ttft=self.ttft.labels(model),
                itl=self.itl.labels(model),
                e2e=self.e2e.labels(model),
                queue=self.queue_time.labels(model),
                prompt_tokens=self.prompt_tokens.labels(model),
                generation_tokens=self.generation_tokens.labels(model),
                success=self.request_success,
                adapter_requests=self.adapter_requests,
                adapter_prompt_tokens=self.adapter_prompt_tokens,
                adapter_generation_tokens=self.adapter_generation_tokens,
                refused=self.requests_refused,
            )
        return series

    # --- HTTP requests (called by the middleware) ---------------------------------------
    def request_done(self, scope: Mapping[str, Any], status: int, seconds: float) -> None:
        route = route_template(scope)
        model = self.model_label(scope) if route != UNMATCHED_ROUTE else ""
        self.requests.labels(model, route, str(status)).inc()
        self.request_duration.labels(model, route).observe(seconds)

    def model_label(self, scope: Mapping[str, Any]) -> str:
        """The model that served a request: the one the generation code recorded, else the one
        named by the path, query or headers, else (for a POST) the only model loaded. Only names
        of loaded models are used, which keeps the label's values bounded."""
        loaded = self.models.models
        recorded = (scope.get("state") or {}).get(STATE_KEY)
        if recorded:
            return str(recorded)
        named = [(scope.get("path_params") or {}).get("model_name")]
        query = parse_qs((scope.get("query_string") or b"").decode("latin-1"))
        named += query.get("model_name", [])[:1]
        headers = dict(scope.get("headers") or [])
        named += [
            headers.get(b"model_name", b"").decode("latin-1"),
            headers.get(b"x-model-name", b"").decode("latin-1"),
        ]
        for name in named:
            if name and name in loaded:
                return name
        if scope.get("method") == "POST" and len(loaded) == 1:
            return next(iter(loaded))
        return ""


class _WithoutCreated(Collector):
    def __init__(self, registry: CollectorRegistry):
        self.registry = registry

    def collect(self) -> Iterable[Metric]:
        for metric in self.registry.collect():  # fresh Metric objects on every collection
            metric.samples = [s for s in metric.samples if not s.name.endswith("_created")]
            yield metric


def route_template(scope: Mapping[str, Any]) -> str:
    """The path template of the route that matched (``/predictions/{model_name}``), never the raw path."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) and path else UNMATCHED_ROUTE


def observe_generation(request: Any, model_name: str) -> GenerationObserver | None:
    """Record which model serves ``request`` and return an observer for its generations
    (None when the app keeps no metrics)."""
    setattr(request.state, STATE_KEY, model_name)
    metrics = getattr(request.app.state, "metrics", None)
    return metrics.observer(model_name) if isinstance(metrics, ServerMetrics) else None
