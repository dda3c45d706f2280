"""An engine model's admission with a stand-in engine client: a burst between two engine steps
is predicted from the requests admitted but not started, a refusal raises 503 with Retry-After
and its reason before anything reaches the engine, and a request's first tokens take it out of
the queue ahead. With option.max_first_token_wait, a first token predicted past it is refused the
same way, and over HTTP each protocol answers 503 with Retry-After in its own error shape."""

from __future__ import annotations

import contextlib

import pytest
from starlette.testclient import TestClient

from lmiserve import wire
from lmiserve.config import load_settings
from lmiserve.errors import Overloaded
from lmiserve.generation.request import GenerationRequest
from lmiserve.rolling_batch.process.client import RequestStream
from lmiserve.server.app import create_app
from lmiserve.serving import EngineModel
from lmiserve.serving.registry import ModelRegistry
from tests.unit.engine_stats import stats

PROMPT = list(range(10, 110))  # 100 prompt tokens


class Client:
    """Takes requests and reports what the test says the engine measured."""

    def __init__(self, **measured):
        self.alive = True
        self.streams: dict[str, RequestStream] = {}
        self.stats = stats(**measured)
        self.sent: list[str] = []

    def submit(self, request_id, prompt_ids, params, adapter="", **more):
        self.sent.append(request_id)
        stream = self.streams[request_id] = RequestStream(request_id, 1)
        return stream


@pytest.fixture
def model(tmp_path, tiny_tokenizer):
    (tmp_path / "serving.properties").write_text("option.max_rolling_batch_size=8\njob_queue_size=8\n")
    m = EngineModel(load_settings(tmp_path, env={}))
    m.tokenizer, m.max_model_len = tiny_tokenizer, 4096
    # the engine computes 100 prompt tokens a second: each request's prompt takes 1 s
    m.client = Client(prefill_tokens_per_s=100.0, decode_step_seconds=0.01)
    return m


def request() -> GenerationRequest:
    return GenerationRequest("", wire.SamplingParams(max_new_tokens=4), prompt_ids=list(PROMPT))


def test_a_burst_between_two_engine_steps_is_refused_past_its_deadline(model):
    model.submit(request(), budget=2.5)
    model.submit(request(), budget=2.5)  # 2 s of prompts: in time
    with pytest.raises(Overloaded) as refused:
        model.submit(request(), budget=2.5)  # 3 s, though the engine has reported nothing waiting
    assert refused.value.status == 503 and refused.value.headers["Retry-After"] == "1"
    assert refused.value.reason == "predicted_delay"
    assert len(model.client.sent) == 2  # the refused request never reached the engine
    model.submit(request(), budget=None)  # no deadline: never too late


def test_a_started_request_is_no_longer_queued_ahead(model):
    first, _, _ = model.submit(request(), budget=10)
    model.submit(request(), budget=10)
    with pytest.raises(Overloaded):
        model.submit(request(), budget=2.5)
    model._decode_step([wire.SeqDelta(request_id=first, token_ids=[7])])
    model.submit(request(), budget=2.5)


def test_a_finished_request_leaves_the_ledger(model):
    first, _, _ = model.submit(request(), budget=10)
    model.submit(request(), budget=10)
    del model.client.streams[first]  # it ended
    model.submit(request(), budget=2.5)


def test_turned_off_the_prediction_refuses_nothing_below_the_queue_limit(tmp_path, tiny_tokenizer):
    (tmp_path / "serving.properties").write_text("option.predictive_admission=false\n")
    m = EngineModel(load_settings(tmp_path, env={}))
    m.tokenizer, m.max_model_len = tiny_tokenizer, 4096
    m.client = Client(prefill_tokens_per_s=100.0, decode_step_seconds=0.01)
    for _ in range(5):
        m.submit(request(), budget=1.0)


def test_below_its_share_a_tenant_is_admitted_where_another_is_refused(model):
    for _ in range(2):
        model.submit(request(), budget=10, tenant="flood")
    with pytest.raises(Overloaded):
        model.submit(request(), budget=2.5, tenant="flood")
    model.submit(request(), budget=2.5, tenant="light")


def test_a_first_token_predicted_past_the_bound_is_refused_without_a_deadline(tmp_path, tiny_tokenizer):
    (tmp_path / "serving.properties").write_text(
        "option.max_rolling_batch_size=8\njob_queue_size=8\noption.max_first_token_wait=1.5\n"
    )
    m = EngineModel(load_settings(tmp_path, env={}))
    m.tokenizer, m.max_model_len = tiny_tokenizer, 4096
    m.client = Client(prefill_tokens_per_s=100.0, decode_step_seconds=0.01)
    m.submit(request(), budget=None)  # its first token in 1 s
    with pytest.raises(Overloaded) as refused:
        m.submit(request(), budget=None)  # in 2 s: 0.5 s past the bound
    assert refused.value.status == 503 and refused.value.headers["Retry-After"] == "1"
    assert refused.value.reason == "first_token_wait"
    assert len(m.client.sent) == 1


def test_over_http_a_first_token_past_the_bound_gets_503_and_retry_after_in_each_protocol(tmp_path, tiny_tokenizer):
    (tmp_path / "serving.properties").write_text("option.max_first_token_wait=2\n")
    settings = load_settings(tmp_path, env={})
    m = EngineModel(settings)
    m.tokenizer, m.max_model_len = tiny_tokenizer, 4096
    m.client = Client(prefill_tokens_per_s=100.0, decode_step_seconds=0.01)
    for _ in range(2):  # 2 s of prompts: the second's first token at the bound, admitted
        m.submit(request(), budget=None)
    registry = ModelRegistry()
    registry.add(m)
    with contextlib.closing(TestClient(create_app(registry, settings))) as c:
        lmi = c.post("/invocations", json={"inputs": "Hello", "parameters": {"max_new_tokens": 4}})
        assert lmi.status_code == 503 and lmi.headers["retry-after"] == "1"
        body = lmi.json()
        assert body["generated_text"] == "" and body["details"]["finish_reason"] == "error"
        openai = c.post("/v1/completions", json={"model": m.name, "prompt": "Hello", "max_tokens": 4})
        assert openai.status_code == 503 and openai.headers["retry-after"] == "1"
        error = openai.json()["error"]
        assert error["type"] == "server_overloaded" and "max_first_token_wait" in error["message"]
        counted = c.get("/metrics").text
    assert f'lmiserve_requests_refused_total{{model="{m.name}",reason="first_token_wait"}} 2.0' in counted
    assert len(m.client.sent) == 2
