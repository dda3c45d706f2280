"""``lmiserve bench`` against a real server on a tiny model, with the transformers baseline."""

import json
import subprocess
import sys

from tests.server_process import ServerProcess


def test_bench_writes_report_and_plot(tiny_llama_dir, tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "serving.properties").write_text(f"model_name=tiny\noption.model_id={tiny_llama_dir}\noption.dtype=fp32\n")
    out = tmp_path / "out"
    with ServerProcess(d) as server:
        server.wait_ready()
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "lmiserve",
                "bench",
                "--url",
                server.url,
                "--concurrency",
                "1,2",
                "--requests",
                "3",
                "--prompt-tokens",
                "24",
                "--max-new-tokens",
                "8",
                "--baseline",
                "--out",
                str(out),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert proc.returncode == 0, proc.stderr
    report = json.loads((out / "report.json").read_text())
    assert [r["concurrency"] for r in report["server"]] == [1, 2]
    for row in report["server"]:
        assert row["errors"] == 0 and row["output_tokens"] == 3 * 8
        assert row["output_tokens_per_s"] > 0 and row["ttft_s"]["p99"] >= row["ttft_s"]["p50"] > 0
    assert [r["concurrency"] for r in report["baseline"]] == [1, 2]
    assert report["config"]["baseline_dtype"] == "fp32"
    assert (out / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| 1 |" in proc.stdout and "| 2 |" in proc.stdout
