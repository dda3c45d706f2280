"""End to end: the real SmolLM2 model behind the default dynamic-batch handler."""

import json
from pathlib import Path

import pytest

from tests.server_process import ServerProcess

from .conftest import MAX_NEW, PROMPTS

pytestmark = pytest.mark.e2e


REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def expected(smollm2_expected):
    return {p: text for p, (_, text) in smollm2_expected.items()}


@pytest.fixture(scope="module")
def server(tmp_path_factory, smollm2_dir):
    d = tmp_path_factory.mktemp("smollm2")
    # serving.properties wins over OPTION_* (DJL's precedence): the overrides go in the file
    extra = "option.dtype=fp32\noption.rolling_batch=disable\n"
    (d / "serving.properties").write_text((REPO / "serving.properties").read_text() + extra)
    with ServerProcess(d) as s:
        yield s.wait_ready(timeout=300)


def test_greedy_output_equals_transformers_generate(server, expected):
    with server.client() as c:
        for prompt in PROMPTS:
            r = c.post("/invocations", json={"inputs": prompt, "parameters": {"max_new_tokens": MAX_NEW}})
            assert r.status_code == 200
            assert r.json() == [{"generated_text": expected[prompt]}]


def test_list_of_prompts_in_one_batch(server, expected):
    with server.client() as c:
        r = c.post("/invocations", json={"inputs": PROMPTS, "parameters": {"max_new_tokens": MAX_NEW}})
    assert r.json() == [{"generated_text": expected[p]} for p in PROMPTS]


def test_streamed_text_equals_generated_text(server, expected):
    with server.client() as c:
        r = c.post(
            "/invocations", json={"inputs": PROMPTS[0], "parameters": {"max_new_tokens": MAX_NEW}, "stream": True}
        )
    lines = [json.loads(x) for x in r.text.splitlines()]
    assert len(lines) > 5
    assert "".join(x["outputs"][0] for x in lines) == expected[PROMPTS[0]]
