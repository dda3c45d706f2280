"""Five minutes of scripts/chaos_soak.py against the real server on a tiny model: 16 clients of
four protocols (LMI and OpenAI streams, TGI, KServe V2 over gRPC) while the engine is SIGKILLed
every 20 to 40 s. Every request ends complete or with its protocol's error, none hangs, the
complete answers equal a clean run's, and the API process's memory stays flat."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.engine_server import start
from tests.server_process import free_port

pytestmark = pytest.mark.soak

CHAOS = Path(__file__).resolve().parents[2] / "scripts" / "chaos_soak.py"


def test_engine_kills_under_load_lose_no_request(tiny_llama_dir, tmp_path):
    report_path = tmp_path / "chaos.json"
    grpc_port = free_port()
    with start(tmp_path / "m", tiny_llama_dir, env={"SERVING_GRPC_PORT": str(grpc_port)}) as s:
        s.wait_ready()
        args = ["--url", s.url, "--grpc", f"127.0.0.1:{grpc_port}", "--pid", str(s.proc.pid)]
        args += ["--duration", "300", "--concurrency", "16", "--max-tokens", "48", "--out", str(report_path)]
        done = subprocess.run([sys.executable, str(CHAOS), *args], capture_output=True, text=True, timeout=900)
        log = s.log()
    report = json.loads(report_path.read_text())
    assert done.returncode == 0 and report["ok"], done.stdout[-4000:] + done.stderr[-3000:]
    assert report["kills"] >= 6 and len(report["ready_after_kill_s"]) == report["kills"]
    outcomes = report["outcomes"]
    assert outcomes.get("hang", 0) == 0 and outcomes.get("unclear", 0) == 0 and outcomes.get("mismatch", 0) == 0
    assert report["success_ratio"] >= 0.97
    assert report["in_flight_at_a_kill"] > 0
    assert all(report["by_kind"][k].get("complete", 0) > 0 for k in report["by_kind"])
    assert "handed to the restarted engine" in log
