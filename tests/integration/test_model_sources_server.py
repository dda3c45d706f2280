"""The server started on a model named by ``s3://`` or by a Hub id (loopback S3 and Hub): ``/ping``
says Loading while the files come, the answers equal transformers on the same model read from a
local directory, an adapter comes from ``s3://`` too, and a refused download stops the start with
a message that says what to set."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.integration.engine_server import Reference, start
from tests.lora_adapters import build_adapter, peft_greedy

PROMPT = "What is Deep Learning?"
N = 12
TOKEN = "hf_loopback_token_value"
METRIC = 'lmiserve_model_download_bytes_total{model=""}'


@pytest.fixture(scope="module")
def reference(tiny_llama_dir):
    return Reference(tiny_llama_dir)


def _generated(server, **body) -> str:
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": N}, **body}
    r = httpx.post(server.url + "/invocations", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["generated_text"]


def _states_until_ready(server, timeout: float = 180) -> list[tuple[int, dict]]:
    """Every distinct (status, body) of /ping until 200."""
    seen: list[tuple[int, dict]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert server.proc.poll() is None, server.log()
        try:
            r = httpx.get(server.url + "/ping", timeout=2)
        except httpx.HTTPError:
            time.sleep(0.05)
            continue
        if not seen or seen[-1] != (r.status_code, r.json()):
            seen.append((r.status_code, r.json()))
        if r.status_code == 200:
            return seen
        time.sleep(0.05)
    raise TimeoutError(server.log())


def test_a_model_and_an_adapter_from_s3(tmp_path, tiny_llama_dir, tiny_tokenizer, reference):
    from tests.aws.s3_server import S3Server

    adapter = build_adapter(tiny_llama_dir, tmp_path / "adapter", seed=5)
    s3 = S3Server()
    try:
        s3.upload_dir(tiny_llama_dir, "models", "tiny")
        s3.upload_dir(adapter, "models", "adapters/a1")
        s3.bytes_per_s = 100_000  # the weights take about five seconds: long enough to see Loading
        env = {**s3.env(), "AWS_EC2_METADATA_DISABLED": "true", "LMISERVE_CACHE": str(tmp_path / "cache")}
        extra = "option.enable_lora=true\noption.max_lora_rank=16\n"
        with start(tmp_path / "m", "s3://models/tiny/", extra, env=env) as server:
            states = _states_until_ready(server)
            s3.bytes_per_s = None
            assert (503, {"tiny": "Loading"}) in states and states[-1] == (200, {"tiny": "Healthy"})
            assert _generated(server) == reference.text(PROMPT, N)
            r = httpx.post(
                server.url + "/models/tiny/adapters", params={"name": "a1", "src": "s3://models/adapters/a1/"}
            )
            assert r.status_code == 200, r.text
            ids = tiny_tokenizer(PROMPT)["input_ids"]
            want = tiny_tokenizer.decode(peft_greedy(tiny_llama_dir, adapter, ids, N), skip_special_tokens=True)
            assert _generated(server, adapters="a1") == want != reference.text(PROMPT, N)
            sent = sum(s3.sent.values())
            [line] = [x for x in httpx.get(server.url + "/metrics").text.splitlines() if x.startswith(METRIC)]
            assert float(line.split()[-1]) == sent
            # the management API registers a model from s3:// too: its files are in place already
            r = httpx.post(
                server.url + "/models", params={"url": "s3://models/tiny/", "model_name": "again"}, timeout=120
            )
            assert r.status_code == 200, r.text
            assert sum(s3.sent.values()) == sent
            body = {"inputs": PROMPT, "parameters": {"max_new_tokens": N}}
            r = httpx.post(server.url + "/predictions/again", json=body, timeout=60)
            assert r.json()["generated_text"] == reference.text(PROMPT, N)
            log = server.log()
            assert "s3://models/tiny/: downloading" in log and f"{tmp_path}/cache/downloads/s3/models/tiny" in log
    finally:
        s3.stop()


def test_a_model_by_hub_id_and_revision_needs_its_token(tmp_path, tiny_llama_dir, reference):
    from tests.hub_server import HubServer

    hub = HubServer()
    try:
        files = {p.name: p.read_bytes() for p in tiny_llama_dir.iterdir() if p.is_file()}
        hub.add(
            "org/tiny", {**files, "pytorch_model.bin": b"not fetched beside safetensors"}, token=TOKEN, revision="v1"
        )
        env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "0"}
        with start(tmp_path / "refused", "org/tiny", "option.revision=v1\n", env=env) as refused:
            assert refused.wait_exit(120) == 1
            assert (
                "org/tiny: the Hub answered 401: the repository is private or gated; set HF_TOKEN to a token "
                "with read access" in refused.log()
            )
        with start(tmp_path / "m", "org/tiny", "option.revision=v1\n", env={**env, "HF_TOKEN": TOKEN}) as server:
            server.wait_ready()
            assert _generated(server) == reference.text(PROMPT, N)
            assert TOKEN not in server.log()
        assert "org/tiny/pytorch_model.bin" not in hub.sent and hub.sent["org/tiny/model.safetensors"] > 0
        snapshot = next((tmp_path / "hf" / "hub" / "models--org--tiny" / "snapshots").iterdir())
        assert (snapshot / "model.safetensors").read_bytes() == files["model.safetensors"]
    finally:
        hub.stop()
