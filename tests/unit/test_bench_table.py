"""scripts/bench_table.py: several bench reports of one server as one table."""

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_table.py"
spec = importlib.util.spec_from_file_location("bench_table", SCRIPT)
bench_table = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench_table)


def report(tmp_path, name, api, levels, baseline=None):
    def row(c, tps):
        return {"concurrency": c, "output_tokens_per_s": tps, "ttft_s": {"p50": 0.012, "p99": 0.030}}

    data = {
        "config": {"api": api, "engine": {"architecture": "llama", "dtype": "bf16", "device": "cuda:0"}},
        "server": [row(c, t) for c, t in levels.items()],
    }
    if baseline:
        data["baseline"] = [{"concurrency": c, "output_tokens_per_s": t} for c, t in baseline.items()]
    directory = tmp_path / name
    directory.mkdir()
    (directory / "report.json").write_text(json.dumps(data))
    return str(directory)


def test_one_row_per_level_with_the_ratio_baseline_and_first_run(tmp_path, capsys):
    lmi = report(tmp_path, "lmi", "lmi", {1: 500.0, 128: 20000.0}, baseline={128: 2889.0})
    openai = report(tmp_path, "openai", "openai", {1: 480.0, 128: 19000.0})
    cold = report(tmp_path, "cold", "lmi", {128: 19500.0})
    assert bench_table.main(["--run", f"lmi={lmi}", "--run", f"openai={openai}", "--cold", cold]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "architecture llama, dtype bf16, device cuda:0"
    assert lines[1].startswith("| c | lmi tok/s | openai tok/s | openai/lmi | TTFT p50/p99 ms (lmi) |")
    assert lines[3] == "| 1 | 500 | 480 | 0.96 | 12/30 | - | - |"
    assert lines[4] == "| 128 | 20,000 | 19,000 | 0.95 | 12/30 | 2,889 | 19,500 |"
