"""The pieces several API processes share: the registry's version, its shared counter, the
metrics sum, and which requests another process answers itself."""

from __future__ import annotations

from lmiserve.config import load_settings
from lmiserve.server.forward import is_data_plane, private
from lmiserve.server.metrics_merge import merge_expositions
from lmiserve.serving import ModelRegistry, VersionFile

MAIN = b"""# HELP lmiserve_requests_total HTTP requests.
# TYPE lmiserve_requests_total counter
lmiserve_requests_total{model="tiny",route="/invocations",status="200"} 3.0
# HELP lmiserve_kv_cache_blocks_used KV-cache blocks in use.
# TYPE lmiserve_kv_cache_blocks_used gauge
lmiserve_kv_cache_blocks_used{model="tiny"} 7.0
"""
OTHER = b"""# HELP lmiserve_requests_total HTTP requests.
# TYPE lmiserve_requests_total counter
lmiserve_requests_total{model="tiny",route="/invocations",status="200"} 4.0
lmiserve_requests_total{model="tiny",route="/generate",status="200"} 2.0
# HELP lmiserve_request_duration_seconds Latency.
# TYPE lmiserve_request_duration_seconds histogram
lmiserve_request_duration_seconds_bucket{le="0.5",route="/generate"} 1.0
lmiserve_request_duration_seconds_sum{route="/generate"} 0.25
"""


def test_expositions_add_up_sample_by_sample():
    merged = merge_expositions([MAIN, OTHER, OTHER]).decode()
    lines = merged.splitlines()
    assert 'lmiserve_requests_total{model="tiny",route="/invocations",status="200"} 11.0' in lines
    assert 'lmiserve_requests_total{model="tiny",route="/generate",status="200"} 4.0' in lines
    assert 'lmiserve_kv_cache_blocks_used{model="tiny"} 7.0' in lines  # reported by the main process only
    assert 'lmiserve_request_duration_seconds_bucket{le="0.5",route="/generate"} 2.0' in lines
    assert 'lmiserve_request_duration_seconds_sum{route="/generate"} 0.5' in lines
    assert lines.count("# TYPE lmiserve_requests_total counter") == 1
    # each family's samples follow its own HELP and TYPE lines
    start = lines.index("# TYPE lmiserve_requests_total counter")
    assert lines[start + 1].startswith("lmiserve_requests_total") and lines[start + 2].startswith(
        "lmiserve_requests_total"
    )
    assert merge_expositions([MAIN]).decode() == MAIN.decode()


class _Model:
    def __init__(self, name: str):
        self.name = name
        self.kind = "engine"
        self.on_change = None


def test_the_registry_counts_its_changes_and_tells_the_shared_counter(tmp_path):
    registry = ModelRegistry()
    shared = VersionFile(str(tmp_path / "version"), create=True)
    reader = VersionFile(str(tmp_path / "version"))
    registry.listeners.append(shared.write)
    model = _Model("a")
    registry.add(model)
    assert registry.version == 1 and reader.read() == 1
    model.on_change()  # an engine started, an adapter registered
    assert reader.read() == 2
    registry.remove("a")
    assert reader.read() == 3
    reader.close()
    shared.close()


def test_only_inference_posts_are_answered_by_another_process():
    def scope(method: str, path: str) -> dict:
        return {"method": method, "path": path, "server": ("127.0.0.1", 8080)}

    for path in ("/invocations", "/generate_stream", "/v1/chat/completions", "/predictions/tiny", "/v2/models/t/infer"):
        assert is_data_plane(scope("POST", path)), path
    for method, path in (("GET", "/ping"), ("POST", "/models"), ("POST", "/adapters"), ("GET", "/v1/models")):
        assert not is_data_plane(scope(method, path)), path
    assert private({"server": ("/tmp/x/main.sock", None)})
    assert not private(scope("GET", "/ping"))


def test_api_processes_default_to_one_per_four_cpus(tmp_path):
    server = load_settings(tmp_path, env={}).server
    assert server.api_processes == 0
    assert [server.api_process_count(cpus) for cpus in (None, 2, 4, 16, 64)] == [1, 1, 1, 4, 8]
    fixed = load_settings(tmp_path, env={"SERVING_API_PROCESSES": "3"}).server
    assert fixed.api_process_count(2) == 3


def test_a_shared_engine_counts_the_requests_of_every_process_against_the_limit(tmp_path):
    from types import SimpleNamespace

    from lmiserve import wire
    from lmiserve.serving import EngineModel

    settings = load_settings(tmp_path, env={})
    stats = wire.EngineStats(
        running=5,
        waiting=2,
        kv_blocks_used=0,
        kv_blocks_total=1,
        prefix_cache_hit_tokens=0,
        preemptions=0,
        prompt_tokens=0,
        generated_tokens=0,
        step_seconds=0.0,
    )
    own_two = {"a": None, "b": None}
    alone = SimpleNamespace(streams=own_two, stats=stats, init=SimpleNamespace(listen_path=""))
    shared = SimpleNamespace(streams=own_two, stats=stats, init=SimpleNamespace(listen_path="/tmp/x/engine-1.sock"))
    model = EngineModel(settings)
    assert model._in_flight(alone) == 2  # one API process: its own requests, as before
    assert model._in_flight(shared) == 7  # the engine's count, other processes' requests included
    model.id_prefix = "p1-"
    assert model._in_flight(SimpleNamespace(streams=own_two, stats=stats)) == 7
    assert model._in_flight(SimpleNamespace(streams=own_two, stats=None)) == 2
