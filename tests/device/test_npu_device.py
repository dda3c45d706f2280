"""On a machine with an Ascend NPU: the self-check (every op, the tiny model, the KV pool)."""

import json

import pytest

pytestmark = pytest.mark.npu


def test_npu_selfcheck(tmp_path):
    from lmiserve.npu_selfcheck import main

    report = tmp_path / "npu_selfcheck.json"
    code = main(["--device", "npu:0", "--report", str(report)])
    failed = [c for c in json.loads(report.read_text())["checks"] if not c["ok"]]
    assert code == 0 and not failed, failed


def test_engine_on_the_npu_gives_transformers_greedy_tokens(tiny_model_dirs, tiny_tokenizer):
    from lmiserve.wire import SamplingParams
    from tests.unit.engine.engine_helpers import hf_greedy, make_engine, run

    model_dir = tiny_model_dirs["llama"]
    prompt = tiny_tokenizer("What is Deep Learning?")["input_ids"]
    engine = make_engine(model_dir, device="npu:0", block_size=128)
    tokens, _, _ = run(engine, {0: [("a", prompt, SamplingParams(max_new_tokens=12))]})
    assert tokens["a"][0] == hf_greedy(model_dir, prompt, 12)
