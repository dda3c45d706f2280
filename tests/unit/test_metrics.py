"""Prometheus metrics: engine counters across restarts, the model-state collector, generation
observations and the HTTP middleware."""

from types import SimpleNamespace

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from starlette.responses import StreamingResponse

from lmiserve.generation.request import RequestOutput, SequenceOutput, TokenOutput
from lmiserve.server.metrics import CONTENT_TYPE, ServerMetrics
from lmiserve.server.middleware import MetricsMiddleware
from lmiserve.server.routes import metrics as metrics_routes
from lmiserve.serving.snapshot import EngineCounters, ModelSnapshot, engine_snapshot
from tests.unit.engine_stats import stats


def samples(metrics: ServerMetrics) -> dict[tuple, float]:
    """Every sample of the exposition, keyed by (name, sorted labels)."""
    out = {}
    for family in text_string_to_metric_families(metrics.expose().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def registry(**models) -> SimpleNamespace:
    return SimpleNamespace(models=models)


# --- the collector -----------------------------------------------------------------------


class FakeEngineModel:
    kind = "engine"

    def __init__(self, client):
        self.client = client
        self.counters = EngineCounters()

    def metrics_snapshot(self) -> ModelSnapshot:
        return engine_snapshot(self.client, self.counters)


class FakeHandlerModel:
    kind = "handler"

    def metrics_snapshot(self) -> ModelSnapshot:
        return ModelSnapshot(running=1, waiting=3)


def test_collector_mirrors_each_models_state():
    client = SimpleNamespace(
        stats=stats(running=2, waiting=1, kv_blocks_used=25, prefix_cache_hit_tokens=16, preemptions=4), info={}
    )
    metrics = ServerMetrics(registry(llm=FakeEngineModel(client), custom=FakeHandlerModel(), other=object()))
    got = samples(metrics)
    llm, custom = (("model", "llm"),), (("model", "custom"),)
    assert got[("lmiserve_requests_running", llm)] == 2
    assert got[("lmiserve_requests_waiting", llm)] == 1
    assert got[("lmiserve_kv_cache_usage_ratio", llm)] == 0.25
    assert got[("lmiserve_kv_cache_blocks_used", llm)] == 25
    assert got[("lmiserve_kv_cache_blocks_total", llm)] == 100
    assert got[("lmiserve_prefix_cache_hit_tokens_total", llm)] == 16
    assert got[("lmiserve_preemptions_total", llm)] == 4
    assert got[("lmiserve_requests_running", custom)] == 1
    assert got[("lmiserve_requests_waiting", custom)] == 3
    assert ("lmiserve_kv_cache_usage_ratio", custom) not in got
    assert not any(labels == (("model", "other"),) for _, labels in got)
    # generation series of an engine model exist from the start
    assert got[("lmiserve_generation_tokens_total", llm)] == 0
    assert got[("lmiserve_time_to_first_token_seconds_count", llm)] == 0
    assert not any(name.endswith("_created") for name, _ in got)

    assert got[("lmiserve_engine_steps_total", (("mode", "graph"), ("model", "llm")))] == 0
    assert ("lmiserve_engine_steps_total", (("mode", "graph"), ("model", "custom"))) not in got

    client.stats = stats(running=0, kv_blocks_used=0, prefix_cache_hit_tokens=20, preemptions=4, graph_steps=7,
                         eager_steps=2)  # fmt: skip
    got = samples(metrics)
    assert got[("lmiserve_engine_steps_total", (("mode", "graph"), ("model", "llm")))] == 7
    assert got[("lmiserve_engine_steps_total", (("mode", "eager"), ("model", "llm")))] == 2
    assert got[("lmiserve_requests_running", llm)] == 0
    assert got[("lmiserve_kv_cache_usage_ratio", llm)] == 0
    assert got[("lmiserve_prefix_cache_hit_tokens_total", llm)] == 20


def test_apps_do_not_share_series():
    first, second = ServerMetrics(registry()), ServerMetrics(registry())
    first.observer("m").close([output("a")])
    assert samples(first)[("lmiserve_request_success_total", (("finish_reason", "abort"), ("model", "m")))] == 1
    assert not any(name == "lmiserve_request_success_total" for name, _ in samples(second))


# --- generation observations -------------------------------------------------------------


def output(request_id: str, sequences: int = 1, prompt_tokens: int = 5) -> RequestOutput:
    return RequestOutput(
        request_id=request_id,
        prompt="p",
        prompt_token_ids=list(range(prompt_tokens)),
        sequences=[SequenceOutput(index=i) for i in range(sequences)],
        arrival=100.0,
    )


def add_tokens(out: RequestOutput, count: int, index: int = 0, finish: str | None = None) -> None:
    seq = out.sequences[index]
    seq.tokens += [TokenOutput(7, "x", -0.1) for _ in range(count)]
    out.last_index = index
    if out.first_token_at is None:
        out.first_token_at = 100.5
        out.queue_us.append(20_000)
    if finish is not None:
        seq.finish_reason = finish
        if out.finished:
            out.finished_at = 102.0


def test_observer_records_latency_tokens_and_finish_reasons():
    metrics = ServerMetrics(registry())
    observer = metrics.observer("m")
    a, b = output("a", prompt_tokens=5), output("b", prompt_tokens=3)
    for step in range(4):
        add_tokens(a, 1, finish="length" if step == 3 else None)
        observer.on_update(a)
    add_tokens(b, 2, finish="eos_token")
    observer.on_update(b)
    observer.on_update(b)  # an update seen twice counts once
    observer.close([a, b])
    got = samples(metrics)
    m = (("model", "m"),)
    assert got[("lmiserve_prompt_tokens_total", m)] == 8
    assert got[("lmiserve_generation_tokens_total", m)] == 6
    assert got[("lmiserve_time_to_first_token_seconds_count", m)] == 2
    assert got[("lmiserve_time_to_first_token_seconds_sum", m)] == pytest.approx(1.0)
    assert got[("lmiserve_inter_token_latency_seconds_count", m)] == 3
    assert got[("lmiserve_e2e_request_latency_seconds_count", m)] == 2
    assert got[("lmiserve_e2e_request_latency_seconds_sum", m)] == pytest.approx(4.0)
    assert got[("lmiserve_queue_time_seconds_sum", m)] == pytest.approx(0.04)
    assert got[("lmiserve_request_success_total", (("finish_reason", "length"), ("model", "m")))] == 1
    assert got[("lmiserve_request_success_total", (("finish_reason", "eos_token"), ("model", "m")))] == 1
    assert ("lmiserve_request_success_total", (("finish_reason", "abort"), ("model", "m"))) not in got


def test_observer_counts_errors_and_aborts_without_latency():
    metrics = ServerMetrics(registry())
    observer = metrics.observer("m")
    failed, gone = output("failed"), output("gone")
    failed.error, failed.finished_at = "refused", 100.1
    failed.sequences[0].finish_reason = "error"
    observer.on_update(failed)
    add_tokens(gone, 2)
    observer.on_update(gone)
    observer.close([failed, gone])
    got = samples(metrics)
    m = (("model", "m"),)
    assert got[("lmiserve_request_success_total", (("finish_reason", "error"), ("model", "m")))] == 1
    assert got[("lmiserve_request_success_total", (("finish_reason", "abort"), ("model", "m")))] == 1
    assert got[("lmiserve_e2e_request_latency_seconds_count", m)] == 0
    assert got[("lmiserve_generation_tokens_total", m)] == 2
    assert got[("lmiserve_prompt_tokens_total", m)] == 5
    metrics.observer("m").close([output("engine-gone")], failed=True)  # the engine went away mid-request
    got = samples(metrics)
    assert got[("lmiserve_request_success_total", (("finish_reason", "error"), ("model", "m")))] == 2


def test_inter_token_latency_is_per_sequence():
    metrics = ServerMetrics(registry())
    observer = metrics.observer("m")
    out = output("a", sequences=2)
    for index in (0, 1, 0, 1):
        add_tokens(out, 1, index=index)
        observer.on_update(out)
    got = samples(metrics)
    assert got[("lmiserve_inter_token_latency_seconds_count", (("model", "m"),))] == 2
    assert got[("lmiserve_generation_tokens_total", (("model", "m"),))] == 4


# --- the middleware and the routes -------------------------------------------------------


@pytest.fixture
def app():
    models = registry(m=FakeHandlerModel(), n=FakeHandlerModel())
    app = FastAPI()
    app.state.registry = models
    app.state.metrics = ServerMetrics(models)

    @app.post("/predictions/{model_name}")
    async def predict(model_name: str):
        return {"model": model_name}

    @app.post("/invocations")
    async def invocations():
        return {}

    @app.get("/stream")
    async def stream():
        async def chunks():
            for i in range(3):
                yield f"chunk {i}\n".encode()

        return StreamingResponse(chunks(), media_type="text/plain")

    @app.get("/boom")
    async def boom():
        raise RuntimeError("boom")

    app.include_router(metrics_routes.router)
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)
    return app


def test_middleware_counts_by_route_template_and_status(app):
    client = TestClient(app, raise_server_exceptions=False)
    assert client.post("/predictions/m").status_code == 200
    assert client.post("/predictions/n").status_code == 200
    assert client.post("/predictions/unknown").status_code == 200
    assert client.get("/predictions/m").status_code == 405
    assert client.post("/invocations", params={"model_name": "n"}).status_code == 200
    assert client.post("/invocations", headers={"X-Model-Name": "m"}).status_code == 200
    assert client.get("/no/such/path").status_code == 404
    assert client.get("/boom").status_code == 500
    assert client.get("/stream").text == "chunk 0\nchunk 1\nchunk 2\n"
    got = samples(app.state.metrics)

    def count(model: str, route: str, status: str) -> float:
        return got.get(("lmiserve_requests_total", (("model", model), ("route", route), ("status", status))), 0)

    assert count("m", "/predictions/{model_name}", "200") == 1
    assert count("n", "/predictions/{model_name}", "200") == 1
    assert count("", "/predictions/{model_name}", "200") == 1  # not a loaded model: no label value
    assert count("m", "/predictions/{model_name}", "405") == 1
    assert count("n", "/invocations", "200") == 1
    assert count("m", "/invocations", "200") == 1
    assert count("", "unmatched", "404") == 1
    assert count("", "/boom", "500") == 1
    assert count("", "/stream", "200") == 1
    assert not any("/no/such/path" in str(labels) for _, labels in got)
    duration = got[
        ("lmiserve_request_duration_seconds_count", (("model", "m"), ("route", "/predictions/{model_name}")))
    ]
    assert duration == 2


def test_metrics_routes_share_one_exposition(app):
    client = TestClient(app)
    client.post("/predictions/m")
    first = client.get("/metrics")
    second = client.get("/server/metrics")
    assert first.status_code == second.status_code == 200
    assert first.headers["content-type"] == second.headers["content-type"] == CONTENT_TYPE
    names = lambda r: {f.name for f in text_string_to_metric_families(r.text)}  # noqa: E731
    assert names(first) == names(second) >= {"lmiserve_requests", "lmiserve_requests_waiting"}
    got = samples(app.state.metrics)
    assert got[("lmiserve_requests_total", (("model", ""), ("route", "/metrics"), ("status", "200")))] == 1
    assert got[("lmiserve_requests_total", (("model", ""), ("route", "/server/metrics"), ("status", "200")))] == 1


def test_post_to_the_only_model_is_labelled_with_it():
    models = registry(only=FakeHandlerModel())
    app = FastAPI()
    app.state.metrics = ServerMetrics(models)

    @app.post("/invocations")
    async def invocations():
        return {}

    @app.get("/ping")
    async def ping():
        return {}

    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)
    client = TestClient(app)
    client.post("/invocations")
    client.get("/ping")
    got = samples(app.state.metrics)
    assert got[("lmiserve_requests_total", (("model", "only"), ("route", "/invocations"), ("status", "200")))] == 1
    assert got[("lmiserve_requests_total", (("model", ""), ("route", "/ping"), ("status", "200")))] == 1


def test_the_api_process_cpu_counter_grows_with_work():
    metrics = ServerMetrics(registry())
    before = samples(metrics)[("lmiserve_api_cpu_seconds_total", (("model", ""),))]
    sum(i * i for i in range(2_000_000))  # some CPU in this process
    after = samples(metrics)[("lmiserve_api_cpu_seconds_total", (("model", ""),))]
    assert 0 < before < after


def test_refusals_are_counted_by_reason():
    metrics = ServerMetrics(registry(llm=FakeEngineModel(SimpleNamespace(stats=None, info={}))))
    metrics.observer("llm").refused("predicted_delay")
    metrics.observer("llm").refused("predicted_delay")
    metrics.observer("llm").refused("queue_full")
    got = samples(metrics)
    assert got[("lmiserve_requests_refused_total", (("model", "llm"), ("reason", "predicted_delay")))] == 2
    assert got[("lmiserve_requests_refused_total", (("model", "llm"), ("reason", "queue_full")))] == 1
