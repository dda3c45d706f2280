"""scripts/spec_bench.py: its configurations, the servers' environment, the bench it runs, and its
table of speed-ups, identical greedy texts and speculative figures."""

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "spec_bench.py"
spec = importlib.util.spec_from_file_location("spec_bench", SCRIPT)
spec_bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(spec_bench)


def test_the_built_in_configurations_and_named_ones():
    default = spec_bench.parse_configs(None, None)
    assert list(default) == ["baseline", "ngram"] and default["baseline"] == {}
    assert json.loads(default["ngram"]["OPTION_SPECULATIVE_CONFIG"]) == {
        "method": "ngram",
        "num_speculative_tokens": 4,
        "prompt_lookup_max": 4,
        "prompt_lookup_min": 2,
    }
    with_draft = spec_bench.parse_configs(None, "/models/small")
    assert json.loads(with_draft["draft"]["OPTION_SPECULATIVE_CONFIG"])["model"] == "/models/small"
    given = spec_bench.parse_configs(
        [["baseline"], ["ngram8", 'OPTION_SPECULATIVE_CONFIG={"method":"ngram","num_speculative_tokens":8}']], None
    )
    assert list(given) == ["baseline", "ngram8"]
    assert given["ngram8"] == {"OPTION_SPECULATIVE_CONFIG": '{"method":"ngram","num_speculative_tokens":8}'}
    with pytest.raises(SystemExit):
        spec_bench.parse_configs([["draft"]], None)  # no draft model given
    with pytest.raises(SystemExit):
        spec_bench.parse_pair("OPTION_X")


def test_every_server_runs_without_predictive_admission_and_deterministic_when_asked(monkeypatch):
    monkeypatch.delenv("OPTION_DETERMINISTIC", raising=False)
    env = spec_bench.server_env({"OPTION_SPECULATIVE_CONFIG": "{}"}, {"OPTION_DEVICE": "cuda:0"}, deterministic=True)
    assert env["OPTION_PREDICTIVE_ADMISSION"] == "false" and env["OPTION_DETERMINISTIC"] == "true"
    assert env["OPTION_DEVICE"] == "cuda:0" and env["OPTION_SPECULATIVE_CONFIG"] == "{}"
    assert "OPTION_DETERMINISTIC" not in spec_bench.server_env({}, {}, deterministic=False)


def test_bench_gets_the_same_prompts_on_every_server():
    args = argparse.Namespace(api="lmi", concurrency="1,8", max_tokens=64, seed=2, requests=0)
    cmd = spec_bench.bench_command(args, "http://127.0.0.1:1", "grounded", Path("/w/ngram/grounded"))
    assert cmd[cmd.index("--workload") + 1] == "grounded" and "--no-salt" in cmd
    assert cmd[cmd.index("--save-outputs") + 1] == "/w/ngram/grounded/outputs.jsonl"
    assert cmd[cmd.index("--max-new-tokens") + 1] == "64" and "--requests" not in cmd


def _line(i, text):
    return {"index": i, "prompt_sha256": f"p{i}", "warmup": False, "text": text}


def test_identical_texts_are_counted_per_level_against_the_base():
    report = {"server": [{"concurrency": 1, "prompt_indices": [0, 3]}, {"concurrency": 8, "prompt_indices": [3, 5]}]}
    base = {i: _line(i, "same") for i in range(5)}
    mine = {**base, 1: _line(1, "other"), 4: _line(4, "other")}
    assert spec_bench.identical_by_level(report, mine, base) == {1: "2/3", 8: "1/2"}
    assert spec_bench.identical_by_level(report, mine, None) == {1: "-", 8: "-"}


def _report(tps, speculative=None):
    row = {"concurrency": 1, "output_tokens_per_s": tps}
    if speculative:
        row["speculative"] = speculative
    return {"server": [row]}


def test_the_table_gives_ratios_to_the_base_and_the_speculative_figures():
    figures = {
        "acceptance_rate": 0.75,
        "mean_accepted_length": 4.0,
        "mean_proposal_length": 4.0,
        "draft_cost_ratio": 0.0,
        "predicted_speedup": 4.0,
        "iid_tokens_per_step": 3.05,
    }
    results = [
        {"config": "baseline", "workload": "grounded", "report": _report(100.0), "identical": {1: "9/9"}},
        {"config": "ngram", "workload": "grounded", "report": _report(250.0, figures), "identical": {1: "8/9"}},
        {"config": "draft", "workload": "grounded", "report": None, "identical": {}},
    ]
    lines = spec_bench.table(results, "baseline").splitlines()
    assert lines[0].count("|") == lines[1].count("|") == lines[2].count("|") == lines[4].count("|")
    assert lines[2] == "| baseline | grounded | 1 | 100.0 | 1.00x | 9/9 | - | - | - | - | - | - |"
    assert lines[3] == "| ngram | grounded | 1 | 250.0 | 2.50x | 8/9 | 0.750 | 4.00 | 4.00 | 0 | 4.00 | 3.05 |"
    assert lines[4].startswith("| draft | grounded | - | failed |")


def test_help():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "--deterministic" in proc.stdout and "--draft-model" in proc.stdout
