"""``lmiserve bench --cpu-report`` on a tiny random model: the report's structure, the weight
bytes a decode step reads against a count made from the checkpoint itself, and the command end
to end. Nothing here asserts on a time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from lmiserve.bench.cpu_report import OTHER, cpu_report, render
from lmiserve.cli import main
from lmiserve.config import load_settings
from lmiserve.model_store import resolve_model
from lmiserve.rolling_batch.core.engine import Engine
from lmiserve.rolling_batch.engine_config import engine_options
from lmiserve.rolling_batch.runner.placement import placed_config

LEVELS = [1, 2]
PROMPT = 16
STEPS = 3
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@pytest.fixture(scope="module")
def engine_and_report(tiny_llama_dir):
    settings = load_settings(tiny_llama_dir, env={})
    path = resolve_model(settings.model.model_id, settings.model_dir)
    config, why = placed_config(str(path), engine_options(settings.model, settings.engine))
    engine = Engine(config)
    try:
        yield engine, cpu_report(engine, why, LEVELS, PROMPT, STEPS)
    finally:
        engine.close()


def checkpoint_bytes(model_dir: Path, dtype: str) -> int:
    """Every tensor of the checkpoint in the engine's dtype but the token embeddings (the tiny
    model's LM head is a tensor of its own)."""
    size = torch.empty(0, dtype=DTYPES[dtype]).element_size()
    total = 0
    for file in model_dir.glob("*.safetensors"):
        with safe_open(file, "pt") as f:
            for name in f.keys():
                if "embed_tokens" not in name:
                    total += _numel(f.get_slice(name).get_shape())
    return total * size


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def test_every_level_has_a_step_time_and_shares_that_add_up(engine_and_report):
    _, report = engine_and_report
    assert [row["concurrency"] for row in report["decode"]] == LEVELS
    for row in report["decode"]:
        assert row["step_s"] > 0 and row["profiled_step_s"] > 0
        assert row["tokens_per_s"] == pytest.approx(row["concurrency"] / row["step_s"])
        named = sum(line["share"] for line in row["ops"])
        assert all(line["share"] >= 0 for line in row["ops"])
        assert named <= 1.0 + 1e-9
        other = row["other"]
        assert other["share"] == pytest.approx(max(0.0, 1.0 - named))
        assert other["torch_ops"] >= 0 and other["python"] >= 0
        assert row["read_ceiling_share"] > 0
    machine = report["machine"]
    assert machine["dtype"] in DTYPES and machine["dtype_why"]
    assert machine["isa_class"] and machine["torch_threads"] >= 1
    prefill = report["prefill"]
    assert prefill["tokens"] == PROMPT and prefill["seconds"] > 0
    assert prefill["ceiling_share"] > 0
    named = sum(line["share"] for line in prefill["ops"])
    assert prefill["ops"] and all(line["share"] >= 0 for line in prefill["ops"]) and named <= 1.0 + 1e-9
    assert prefill["other"]["share"] == pytest.approx(max(0.0, 1.0 - named))
    text = render(report)
    assert OTHER in text and "prefill of 16 tokens" in text
    after_prefill = text.split("prefill of 16 tokens")[1]
    assert prefill["ops"][0]["op"] in after_prefill and OTHER in after_prefill


def test_the_bytes_a_step_reads_are_the_checkpoints_less_the_embeddings(engine_and_report, tiny_llama_dir):
    _, report = engine_and_report
    expected = checkpoint_bytes(Path(tiny_llama_dir), report["machine"]["dtype"])
    assert report["step_bytes"]["bytes"] == expected


def test_prefill_counts_the_decoder_layers_linear_weights(engine_and_report, tiny_llama_dir):
    _, report = engine_and_report
    config = json.loads((Path(tiny_llama_dir) / "config.json").read_text())
    hidden, inter, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    head_dim = hidden // config["num_attention_heads"]
    qkv = (config["num_attention_heads"] + 2 * config["num_key_value_heads"]) * head_dim * hidden
    per_layer = qkv + hidden * hidden + 2 * inter * hidden + inter * hidden
    assert report["prefill"]["linear_elements"] == layers * per_layer


def test_the_command_runs_end_to_end(tiny_llama_dir, tmp_path, capsys):
    argv = ["bench", "--cpu-report", "--model-dir", str(tiny_llama_dir), "--concurrency", "1,2"]
    assert main([*argv, "--steps", "3", "--prompt-tokens", "16", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "concurrency 2:" in printed and "ceilings:" in printed
    written = json.loads((tmp_path / "cpu-report.json").read_text())
    assert [row["concurrency"] for row in written["decode"]] == [1, 2]
    assert written["config"]["steps"] == 3
