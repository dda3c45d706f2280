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


def test_grounded_outputs_of_two_runs_are_saved_and_compared(tmp_path):
    """The grounded workload over a chat API, every request's greedy text saved by prompt index;
    two runs on the same prompts give the same texts."""
    from tests.tiny_models import build_model

    model = build_model(tmp_path / "model", "llama", max_position_embeddings=2048)  # a small vocabulary's long prompts
    d = tmp_path / "m"
    d.mkdir()
    (d / "serving.properties").write_text(f"model_name=tiny\noption.model_id={model}\noption.dtype=fp32\n")
    runs = []
    with ServerProcess(d) as server:
        server.wait_ready()
        for name in ("a", "b"):
            runs.append(
                subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "lmiserve",
                        "bench",
                        "--url",
                        server.url,
                        "--api",
                        "openai-chat",
                        "--workload",
                        "grounded",
                        "--no-salt",
                        "--concurrency",
                        "2",
                        "--requests",
                        "3",
                        "--max-new-tokens",
                        "6",
                        "--out",
                        str(tmp_path / name),
                        "--save-outputs",
                        str(tmp_path / f"{name}.jsonl"),
                    ],
                    capture_output=True,
                    text=True,
                    timeout=300,
                )  # fmt: skip
            )
    for proc in runs:
        assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "a" / "report.json").read_text())
    assert report["config"]["workload"] == "grounded" and report["server"][0]["prompt_indices"] == [0, 5]
    assert "speculative" not in report["server"][0]  # a server without speculation
    lines = [json.loads(line) for line in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert [line["index"] for line in lines] == [0, 1, 2, 3, 4] and [line["warmup"] for line in lines[:3]] == [
        True, True, False,
    ]  # fmt: skip
    assert all(line["text"] and "error" not in line for line in lines)
    compared = subprocess.run(
        [sys.executable, "-m", "lmiserve", "bench", "--compare-outputs", str(tmp_path / "a.jsonl"),
         str(tmp_path / "b.jsonl")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert compared.returncode == 0 and "identical greedy texts: 5/5" in compared.stdout
