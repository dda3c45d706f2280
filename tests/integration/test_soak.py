"""A short run of scripts/soak.py against the real server on a tiny model: every request ends
with a complete answer or a clear error, none hangs, and the KV cache is free afterwards."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.engine_server import start

pytestmark = pytest.mark.soak

SOAK = Path(__file__).resolve().parents[2] / "scripts" / "soak.py"


def test_short_soak_has_no_hangs_and_frees_every_block(tiny_llama_dir, tmp_path):
    report_path = tmp_path / "soak.json"
    with start(tmp_path / "m", tiny_llama_dir) as s:
        s.wait_ready()
        args = ["--url", s.url, "--pid", str(s.proc.pid), "--duration", "20", "--requests", "3000"]
        args += ["--concurrency", "4", "--max-tokens", "16", "--request-timeout", "60", "--out", str(report_path)]
        done = subprocess.run([sys.executable, str(SOAK), *args], capture_output=True, text=True, timeout=180)
    report = json.loads(report_path.read_text())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert report["ok"] and report["failures"] == []
    assert report["outcomes"].get("hang", 0) == 0 and report["outcomes"].get("unclear", 0) == 0
    assert report["outcomes"]["complete"] > 0 and report["outcomes"].get("disconnected", 0) > 0
    assert report["after_load"] == {
        "lmiserve_requests_running": 0.0,
        "lmiserve_requests_waiting": 0.0,
        "lmiserve_kv_cache_blocks_used": 0.0,
    }
    kinds = {k.removesuffix("-disconnect") for k in report["by_kind"]}
    assert kinds >= {"lmi", "lmi-stream", "tgi-stream", "chat-stream", "completions", "kserve-stream", "databricks"}
    assert report["rss_peak_mib"] > 0 and report["rss_growth_mib"] <= report["rss_growth_bound_mib"]
