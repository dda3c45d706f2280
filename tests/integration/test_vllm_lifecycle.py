"""option.rolling_batch=vllm behind the real server, its lifecycle: an engine that dies and starts
again, and start-up failures, each on a server of its own (the fake vllm package on the server
process's path only, see vllm_server)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time

import pytest

from lmiserve.rolling_batch.vllm.engine_info import NOT_INSTALLED
from tests.server_process import ServerProcess, free_port

from .test_vllm_backend import expected, vocab_size  # noqa: F401 - fixtures
from .vllm_server import (
    OTHER,
    PROMPT,
    FakeLog,
    server_env,
    serving_dir,
)

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is not None, reason="a real vllm is installed; these tests need it absent"
    ),
    pytest.mark.serial,
]


# --- an engine that dies, then starts again ----------------------------------------------------


def test_engine_death_fails_requests_then_the_engine_restarts(tiny_llama_dir, tmp_path, expected):  # noqa: F811
    log = FakeLog(tmp_path / "events.jsonl")
    hold = tmp_path / "hold-start"
    root = serving_dir(tmp_path / "m", tiny_llama_dir, "option.max_model_len=256\n")
    env = server_env(log=log.path, delay=0.05, die_after=2, hold_start=hold)
    with ServerProcess(root, env=env) as s:
        s.wait_ready()
        long = {"inputs": PROMPT, "parameters": {"max_new_tokens": 200, "ignore_eos_token": True}, "stream": True}
        with s.client() as c:
            with c.stream("POST", "/invocations", json=long) as r:
                assert r.status_code == 200
                lines = r.iter_lines()
                first = json.loads(next(lines))
                hold.touch()  # the engine's next start waits until the test lets it go
                dying = c.post("/generate", json={"inputs": OTHER, "parameters": {"max_new_tokens": 5}})
                rest = [json.loads(line) for line in lines if line]
            assert first["token"]["text"] == "`"
            assert dying.status_code == 503
            assert dying.json() == {
                "error": "the vLLM engine died while handling this request: EngineDeadError: "
                "EngineCore encountered an issue.",
                "error_type": "generation",
            }
            assert rest[-1]["details"]["finish_reason"] == "error" and rest[-1]["token"]["id"] == -1
            assert len(rest) < 200

            deadline = time.monotonic() + 60
            while c.get("/ping").status_code != 503 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert c.get("/ping").json() == {"tiny": "Unhealthy"}
            refused = c.post("/invocations", json={"inputs": OTHER, "parameters": {"max_new_tokens": 2}})
            assert refused.status_code == 503 and refused.json() == {
                "generated_text": "",
                "details": {"finish_reason": "error", "generated_tokens": None, "inputs": None, "tokens": None},
            }

            hold.unlink()
            deadline = time.monotonic() + 60
            while c.get("/ping").status_code != 200 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert c.get("/ping").json() == {"tiny": "Healthy"}
            r = c.post("/invocations", json={"inputs": OTHER, "parameters": {"max_new_tokens": 3}})
            assert r.status_code == 200 and r.json() == {"generated_text": expected(OTHER, 3)[1]}
    assert [e["event"] for e in log.events() if e["event"] in ("engine_args", "shutdown")][:3] == [
        "engine_args",
        "shutdown",
        "engine_args",
    ]


# --- start-up failures -------------------------------------------------------------------------


def test_vllm_failing_to_start_stops_the_server_with_one_line(tiny_llama_dir, tmp_path):
    root = serving_dir(tmp_path / "m", tiny_llama_dir)
    failure = "1 validation error for ModelConfig\n  no accelerator found"  # vLLM's errors may span lines
    server = ServerProcess(root, env=server_env(fail_start=failure))
    try:
        assert server.wait_exit() == 1
    finally:
        server.stop()
    log = server.log()
    assert "Traceback" not in log
    assert "vLLM could not start: RuntimeError: 1 validation error for ModelConfig; no accelerator found" in (
        log.splitlines()
    )


def test_without_vllm_the_server_stops_with_the_install_hint(tiny_llama_dir, tmp_path):
    root = serving_dir(tmp_path / "m", tiny_llama_dir)
    env = {**os.environ, **server_env(fake=False)}
    command = [sys.executable, "-m", "lmiserve", "serve", "--model-dir", str(root)]
    proc = subprocess.run(
        [*command, "--host", "127.0.0.1", "--port", str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.endswith(f"cannot start model tiny: {NOT_INSTALLED}")
    assert "Traceback" not in proc.stderr
