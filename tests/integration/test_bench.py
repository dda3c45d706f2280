"""``lmiserve bench`` against a real server on a tiny model, with the transformers baseline."""

import json
import os
import subprocess
import sys

from tests.server_process import ServerProcess


def test_bench_writes_report_and_plot(tiny_llama_dir, tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "serving.properties").write_text(f"model_name=tiny\noption.model_id={tiny_llama_dir}\noption.dtype=fp32\n")
    out = tmp_path / "out"
    # a Python on which matplotlib cannot be imported
    blocker = tmp_path / "no-matplotlib" / "matplotlib"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('No module named matplotlib')\n")
    bare_env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(blocker.parent), os.environ.get("PYTHONPATH")]))
    )
    with ServerProcess(d) as server:
        server.wait_ready()
        bare = subprocess.run(
            [sys.executable, "-m", "lmiserve", "bench", "--url", server.url, "--concurrency", "1", "--requests", "2",
             "--prompt-tokens", "16", "--max-new-tokens", "4", "--out", str(tmp_path / "bare")],
            capture_output=True, text=True, timeout=300, env=bare_env,
        )  # fmt: skip
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
    assert report["config"]["baseline_device"] == "cpu"
    assert (out / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| 1 |" in proc.stdout and "| 2 |" in proc.stdout

    # without matplotlib the figures are still printed and written; only the plot is missing
    assert bare.returncode == 0, bare.stderr
    assert "no plot" in bare.stderr and "| 1 |" in bare.stdout
    assert json.loads((tmp_path / "bare" / "report.json").read_text())["server"][0]["errors"] == 0
    assert not (tmp_path / "bare" / "report.png").exists()
