"""``container/serve`` outside Docker: the SageMaker hosting contract against the real server."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.container.serve_process import SERVE, ContainerServe, sagemaker_env
from tests.server_process import free_port

TINY_OPTIONS = "option.rolling_batch=lmi\noption.dtype=fp32\noption.max_model_len=256\n"


@pytest.fixture
def model_dir(tmp_path, tiny_llama_dir):
    """A SageMaker model directory: serving.properties pointing at a tiny random Llama."""
    d = tmp_path / "opt-ml-model"
    d.mkdir()
    (d / "serving.properties").write_text(f"model_name=tiny\noption.model_id={tiny_llama_dir}\n" + TINY_OPTIONS)
    return d


def test_serve_answers_ping_and_invocations_on_the_bind_to_port(model_dir, tmp_path):
    with ContainerServe(model_dir, tmp_path) as serve:
        serve.wait_ready()
        with serve.client() as client:
            ping = client.get("/ping")
            assert ping.status_code == 200 and ping.json() == {"tiny": "Healthy"}

            body = {"inputs": "What is Deep Learning?", "parameters": {"max_new_tokens": 5, "details": True}}
            answer = client.post("/invocations", json=body)
            assert answer.status_code == 200, answer.text
            assert answer.json()["details"]["generated_tokens"] == 5

            with client.stream("POST", "/invocations", json={**body, "stream": True}) as stream:
                assert stream.status_code == 200
                lines = [json.loads(line) for line in stream.iter_lines() if line]
            assert len(lines) == 5 and "generated_text" in lines[-1]

            described = client.get("/models/tiny").json()[0]
            assert described["modelUrl"] == str(model_dir.resolve())
        log = serve.log()
    # SAGEMAKER_BIND_TO_PORT chose the port; start-up says what was loaded and how long it took
    assert f"on http://127.0.0.1:{serve.port}" in log
    assert "loading model tiny: option.model_id=" in log and "serving.properties" in log
    loaded = next(line for line in log.splitlines() if "model tiny ready in" in line)
    assert "after start-up began" in loaded and "weights " in loaded and "architecture llama" in loaded


def test_a_model_directory_without_serving_properties_is_configured_by_the_environment(tmp_path, tiny_llama_dir):
    empty = tmp_path / "opt-ml-model"
    empty.mkdir()
    env = {
        "HF_MODEL_ID": str(tiny_llama_dir),
        "OPTION_ROLLING_BATCH": "lmi",
        "OPTION_DTYPE": "fp32",
        "OPTION_MAX_MODEL_LEN": "256",
        "SERVING_MODEL_NAME": "from-env",
    }
    with ContainerServe(empty, tmp_path, **env) as serve:
        serve.wait_ready()
        with serve.client() as client:
            assert client.get("/ping").json() == {"from-env": "Healthy"}
            answer = client.post("/invocations", json={"inputs": "Hello", "parameters": {"max_new_tokens": 3}})
            assert answer.status_code == 200 and "generated_text" in answer.json()
            described = client.get("/models/from-env").json()[0]
            assert described["rollingBatch"] == "lmi"
            assert described["engine"]["dtype"] == "fp32" and described["engine"]["max_model_len"] == 256
        # an idle server stops at once on SIGTERM, with status 0
        serve.sigterm()
        assert serve.proc.wait(timeout=60) == 0
        assert "SIGTERM received: no request in flight; stopping" in serve.log()


def test_serve_runs_any_other_command(tmp_path):
    env = sagemaker_env(None, free_port())
    env.pop("HF_HUB_OFFLINE", None)
    done = subprocess.run([str(SERVE), "bash", "-c", 'echo "[$HF_HUB_OFFLINE]"; exit 3'], env=env, capture_output=True)
    assert done.returncode == 3
    # only `serve` sets up the server's environment; another command runs as it is
    assert done.stdout.decode().strip() == "[]"

    shown = subprocess.run(
        [str(SERVE), "lmiserve", "config", "show", "--model-dir", str(tmp_path)],
        env={**env, "SAGEMAKER_BIND_TO_PORT": "8123"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    port_row = next(line.split() for line in shown.stdout.splitlines() if line.split()[:1] == ["port"])
    assert port_row == ["port", "8123", "env", "SAGEMAKER_BIND_TO_PORT"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], ["serve", "--model-dir", "{model}"]),
        (["serve"], ["serve", "--model-dir", "{model}"]),
        (["serve", "--log-level", "debug"], ["serve", "--model-dir", "{model}", "--log-level", "debug"]),
    ],
)
def test_serve_hands_the_model_directory_and_its_flags_to_lmiserve(tmp_path, args, expected):
    """What `serve` execs, seen through a stand-in `lmiserve` that prints its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "lmiserve"
    fake.write_text('#!/usr/bin/env bash\necho "HF_HUB_OFFLINE=$HF_HUB_OFFLINE"\nprintf "%s\\n" "$@"\n')
    fake.chmod(0o755)
    model = tmp_path / "model"
    model.mkdir()
    env = sagemaker_env(model, free_port())
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    env.pop("HF_HUB_OFFLINE", None)
    done = subprocess.run([str(SERVE), *args], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "HF_HUB_OFFLINE="  # downloads stay on unless the user turns them off
    assert lines[1:] == [a.format(model=model) for a in expected]

    # no model directory: lmiserve falls back to its own default, and serve says so
    env["SM_MODEL_DIR"] = str(tmp_path / "absent")
    done = subprocess.run([str(SERVE)], env=env, capture_output=True, text=True, timeout=30)
    assert done.stdout.splitlines()[1:] == ["serve"]
    assert "no model directory at" in done.stderr
