"""On a machine with a CUDA GPU: the server streaming 64 requests at once from the engine's CUDA
graphs, every answer checked against transformers, and no kernel compiled after ready."""

import concurrent.futures
import json

import pytest

from tests.integration.engine_server import Reference, start

pytestmark = pytest.mark.cuda

CLIENTS = 64


def stream_text(server, prompt: str, n: int) -> str:
    body = {"inputs": prompt, "parameters": {"max_new_tokens": n}, "stream": True}
    with server.client() as c, c.stream("POST", "/invocations", json=body) as r:
        assert r.status_code == 200
        lines = [json.loads(line) for line in r.iter_lines() if line.strip()]
    text = lines[-1]["generated_text"]
    assert "".join(line["token"]["text"] for line in lines) == text  # the pieces add up
    return text


def test_64_concurrent_streams_each_give_transformers_text(tiny_llama_dir, tmp_path):
    reference = Reference(tiny_llama_dir)
    jobs = [(f"Request {i}: the quick brown fox jumps over", 8 + i % 24) for i in range(CLIENTS)]
    extra = "option.device=cuda:0\noption.max_rolling_batch_size=64\n"
    with start(tmp_path / "m", tiny_llama_dir, extra) as server:
        server.wait_ready()
        with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
            texts = list(pool.map(lambda job: stream_text(server, *job), jobs))
        with server.client() as c:
            stats = c.get("/models/tiny").json()[0]["stats"]
    assert texts == [reference.text(p, n) for p, n in jobs]
    assert stats["graph_steps"] > 0
    assert stats["kernel_compiles"] == 0  # the warm-up compiled every kernel a request reached
