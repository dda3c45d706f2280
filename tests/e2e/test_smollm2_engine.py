"""End to end: SmolLM2 served by the continuous-batching engine (the default backend)."""

import concurrent.futures
import json
from pathlib import Path

import pytest

from tests.server_process import ServerProcess

from .conftest import MAX_NEW, PROMPTS

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server(tmp_path_factory, smollm2_dir):
    d = tmp_path_factory.mktemp("smollm2-engine")
    # serving.properties wins over OPTION_* (DJL's precedence): the override goes in the file
    (d / "serving.properties").write_text((REPO / "serving.properties").read_text() + "option.dtype=fp32\n")
    with ServerProcess(d) as s:
        yield s.wait_ready(timeout=300)


def generate(server, prompt, **params):
    with server.client() as c:
        r = c.post(
            "/invocations",
            json={"inputs": prompt, "parameters": {"max_new_tokens": MAX_NEW, "details": True, **params}},
        )
    assert r.status_code == 200, r.text
    return r.json()


def test_the_default_backend_is_the_engine(server):
    with server.client() as c:
        info = c.get("/models/smollm2").json()[0]
    assert info["backend"] == "lmi" and info["engine"]["architecture"] == "llama"


def test_greedy_tokens_equal_transformers_generate_in_one_running_batch(server, smollm2_expected):
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        results = dict(zip(PROMPTS, pool.map(lambda p: generate(server, p), PROMPTS)))
    for prompt, (ids, text) in smollm2_expected.items():
        body = results[prompt]
        assert [t["id"] for t in body["details"]["tokens"]] == ids
        assert body["generated_text"] == text


def test_streamed_text_equals_generated_text(server, smollm2_expected):
    with server.client() as c:
        r = c.post(
            "/invocations", json={"inputs": PROMPTS[0], "parameters": {"max_new_tokens": MAX_NEW}, "stream": True}
        )
    lines = [json.loads(x) for x in r.text.splitlines()]
    assert (
        "".join(line["token"]["text"] for line in lines)
        == lines[-1]["generated_text"]
        == smollm2_expected[PROMPTS[0]][1]
    )
