"""scripts/chaos_soak.py against the real server on a tiny model: 16 clients of four protocols
(LMI and OpenAI streams, TGI, KServe V2 over gRPC) while the engine is SIGKILLed again and again.
`make test` runs it for 60 s, an engine killed every 8 to 14 s; `make soak` for five minutes
(LMISERVE_CHAOS_SECONDS=300), every 20 to 40 s. Every request ends complete or with its protocol's error, none hangs, the
complete answers equal a clean run's, and the API process's memory stays flat."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.engine_server import start
from tests.server_process import free_port

pytestmark = [pytest.mark.soak, pytest.mark.serial]

CHAOS = Path(__file__).resolve().parents[2] / "scripts" / "chaos_soak.py"
SECONDS = float(os.environ.get("LMISERVE_CHAOS_SECONDS", "60"))
KILL_EVERY = ("8", "14") if SECONDS < 300 else ("20", "40")


def test_engine_kills_under_load_lose_no_request(tiny_llama_dir, tmp_path):
    report_path = tmp_path / "chaos.json"
    grpc_port = free_port()
    # the standby engine on, as on any CPU deployment: the restarts under test are production's
    env = {"SERVING_GRPC_PORT": str(grpc_port), "OPTION_ENGINE_STANDBY": "true"}
    with start(tmp_path / "m", tiny_llama_dir, env=env) as s:
        s.wait_ready()
        args = ["--url", s.url, "--grpc", f"127.0.0.1:{grpc_port}", "--pid", str(s.proc.pid)]
        args += ["--duration", str(SECONDS), "--kill-min", KILL_EVERY[0], "--kill-max", KILL_EVERY[1]]
        args += ["--concurrency", "16", "--max-tokens", "48", "--out", str(report_path)]
        done = subprocess.run([sys.executable, str(CHAOS), *args], capture_output=True, text=True, timeout=900)
        log = s.log()
    report = json.loads(report_path.read_text())
    assert done.returncode == 0 and report["ok"], done.stdout[-4000:] + done.stderr[-3000:]
    assert report["kills"] >= max(2, int(SECONDS // 50)) and len(report["ready_after_kill_s"]) == report["kills"]
    outcomes = report["outcomes"]
    assert outcomes.get("hang", 0) == 0 and outcomes.get("unclear", 0) == 0 and outcomes.get("mismatch", 0) == 0
    assert report["success_ratio"] >= 0.97
    assert report["in_flight_at_a_kill"] > 0
    assert all(report["by_kind"][k].get("complete", 0) > 0 for k in report["by_kind"])
    assert "handed to the restarted engine" in log
