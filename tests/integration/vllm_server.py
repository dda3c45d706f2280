"""A server with option.rolling_batch=vllm and the fake vllm package (tests/fakes) on its path
only, and what the fake records and generates.

The fake continues a prompt with token ``4 + (sum(prompt) + seed + i) % (vocab_size - 4)`` (the
seed counts only when sampling), each with log-probability ``-0.5 - (token % 4) / 8``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import httpx

from tests.server_process import ServerProcess, sse_data  # noqa: F401 - the tests import it from here
from tests.server_process import serving_dir as write_serving_dir

FAKES = Path(__file__).resolve().parents[1] / "fakes"
FAKE_VARS = ("LOG", "EOS_AFTER", "DELAY", "DIE_AFTER", "FAIL_START", "HOLD_START")
PROMPT = "Numbers: 1 2 3"  # the fake continues it with readable ASCII: "`abcdefghijk..."
OTHER = "hi there"


def serving_dir(root: Path, model_dir: Path, extra: str = "") -> Path:
    return write_serving_dir(
        root, f"model_name=tiny\noption.model_id={model_dir}\noption.rolling_batch=vllm\ngrpc_port=0\n" + extra
    )


def server_env(fake: bool = True, **fake_vars: object) -> dict[str, str]:
    """The server's environment: the fake vllm first on its PYTHONPATH (or kept off it)."""
    env = {f"FAKE_VLLM_{name}": "" for name in FAKE_VARS}
    env.update({f"FAKE_VLLM_{name.upper()}": str(value) for name, value in fake_vars.items()})
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != FAKES]
    env["PYTHONPATH"] = os.pathsep.join(([str(FAKES)] if fake else []) + paths)
    return env


class FakeLog:
    """The events the fake vllm recorded, one JSON object a line."""

    def __init__(self, path: Path):
        self.path = path

    def events(self, kind: str | None = None, start: int = 0) -> list[dict]:
        if not self.path.exists():
            return []
        lines = self.path.read_text().split("\n")[:-1]  # a line is complete once its newline is written
        rows = [json.loads(line) for line in lines[start:]]
        return [r for r in rows if kind is None or r["event"] == kind]

    def mark(self) -> int:
        return len(self.events())

    def wait_for(self, kind: str, request_id: str, timeout: float = 30) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            found = [e for e in self.events(kind) if e.get("request_id") == request_id]
            if found:
                return found[0]
            if time.monotonic() > deadline:
                raise AssertionError(f"no {kind} event for {request_id}: {self.events()}")
            time.sleep(0.05)


def fake_ids(prompt_ids: list[int], count: int, vocab_size: int, seed: int = 0) -> list[int]:
    base = sum(prompt_ids) + seed
    return [4 + (base + i) % (vocab_size - 4) for i in range(count)]


def fake_logprob(token: int) -> float:
    return -0.5 - (token % 4) / 8


def running_gauge(server: ServerProcess) -> float:
    lines = httpx.get(server.url + "/metrics").text.splitlines()
    [line] = [x for x in lines if x.startswith('lmiserve_requests_running{model="tiny"}')]
    return float(line.split()[-1])
