"""Steps with adapters replayed from the step graphs (the recording stand-in for CUDA graphs, fp32
CPU ops): a decode step of four adapters and base requests replays the same bucket as a step of
base requests alone, every step of the run is a graph step, and the tokens are the eager
engine's; a step's segments reach the graphs' fixed buffers."""

import numpy as np
import pytest

from lmiserve import wire
from lmiserve.rolling_batch.runner import graphs
from lmiserve.wire import SamplingParams
from tests.lora_adapters import build_adapter
from tests.unit.engine.engine_helpers import make_engine, run
from tests.unit.engine.recording_graphs import RecordingBackend

PROMPTS = ("What is Deep Learning?", "Hi", "The quick brown fox", "A b c d", "Paged attention", "One two")
NAMES = ("a0", "", "a1", "a2", "", "a3")
"""Four adapters and two base requests, the base ones between adapted ones."""
LIMITS = dict(enable_lora=True, max_loras=4, max_lora_rank=8, max_num_seqs=8, max_num_batched_tokens=64,
              max_decode_step_prefill_tokens=64)  # fmt: skip


@pytest.fixture(scope="module")
def four_adapters(tmp_path_factory, tiny_model_dirs):
    root = tmp_path_factory.mktemp("lora-graphs")
    model_dir = tiny_model_dirs["llama"]
    targets = (None, ["q_proj", "v_proj"], ["gate_proj", "up_proj", "down_proj"], ["o_proj", "k_proj"])
    return {
        f"a{i}": build_adapter(model_dir, root / f"a{i}", seed=20 + i, rank=4 + 2 * (i % 2), targets=t)
        for i, t in enumerate(targets)
    }


def _engine(monkeypatch, model_dir, adapters, **overrides):
    recorder = RecordingBackend()
    monkeypatch.setattr(graphs, "backend_for", lambda device: recorder)
    engine = make_engine(model_dir, **{**LIMITS, **overrides})
    for i, (name, path) in enumerate(adapters.items()):
        command = wire.AdapterCommand(op_id=i, action="register", name=name, src=str(path))
        assert engine.adapter_command(command).kind is None
    return engine, recorder


def _requests(tokenizer, names, new_tokens=5):
    ids = [tokenizer(p)["input_ids"] for p in PROMPTS]
    return [(f"r{i}", ids[i], SamplingParams(max_new_tokens=new_tokens), name) for i, name in enumerate(names)]


def _run(engine, requests):
    for rid, prompt, params, name in requests:
        engine.add_request(rid, prompt, params, name)
    return run(engine, {0: []})[0]


@pytest.mark.usefixtures("scheduling")  # serial steps, then overlapped ones
def test_adapters_and_base_rows_replay_the_base_steps_graphs(monkeypatch, tiny_model_dirs, tiny_tokenizer,
                                                              four_adapters):  # fmt: skip
    model_dir = tiny_model_dirs["llama"]
    engine, recorder = _engine(monkeypatch, model_dir, four_adapters)
    runner = engine.runner
    assert runner.lora_buffers is not None and runner.lora_buffers.capacity == 4
    captures = len(recorder.log)
    tokens = _run(engine, _requests(tiny_tokenizer, NAMES))
    assert runner.eager_steps == 0 and runner.graph_steps > 0  # every step, prompts too, from a graph
    adapted_steps = dict(runner.steps)
    assert adapted_steps.get(("decode", 8), 0) >= 3  # six decodes (four adapters, two base) in bucket 8
    assert set(adapted_steps) <= runner.warm_keys

    base = _run(engine, _requests(tiny_tokenizer, [""] * 6))
    assert runner.eager_steps == 0
    assert runner.steps[("decode", 8)] > adapted_steps[("decode", 8)]  # the same bucket's graph
    assert all(kind == "replay" for kind, _ in recorder.log[captures:])  # nothing captured again
    for i, name in enumerate(NAMES):  # base rows beside adapters are the base's
        if not name:
            assert tokens[f"r{i}"] == base[f"r{i}"]
    assert any(tokens[f"r{i}"] != base[f"r{i}"] for i, name in enumerate(NAMES) if name)  # the adapters ran

    eager = make_engine(model_dir, enforce_eager=True, **LIMITS)
    for i, (name, path) in enumerate(four_adapters.items()):
        command = wire.AdapterCommand(op_id=i, action="register", name=name, src=str(path))
        assert eager.adapter_command(command).kind is None
    assert eager.runner.graphs is None
    assert _run(eager, _requests(tiny_tokenizer, NAMES)) == tokens
    assert _run(eager, _requests(tiny_tokenizer, [""] * 6)) == base


def test_a_steps_segments_reach_the_buffers(monkeypatch, tiny_model_dirs, tiny_tokenizer, four_adapters):
    """Each step's adapted rows listed slot by slot in the fixed buffers, one segment per slot,
    rows past the step's (a bucket's padding) in no segment; a base-only step after them empties
    the segments."""
    engine, _ = _engine(monkeypatch, tiny_model_dirs["llama"], four_adapters)
    buffers = engine.runner.lora_buffers
    seen = []
    fill = buffers.fill

    def recording_fill(arrays):
        runs = fill(arrays)
        seen.append((arrays, buffers.ints.clone()))
        return runs

    monkeypatch.setattr(buffers, "fill", recording_fill)
    _run(engine, _requests(tiny_tokenizer, NAMES, new_tokens=3))
    assert seen and all(arrays.lora_slots is not None for arrays, _ in seen)
    for arrays, ints in seen:
        per_token = np.repeat(arrays.lora_slots, np.diff(arrays.cu_q_lens))
        slots, firsts, ends = (ints[i * 4 : i * 4 + 4].tolist() for i in range(3))
        rows = ints[12:].tolist()
        used = sorted(set(per_token[per_token >= 0].tolist()))
        assert slots[: len(used)] == used and all(f == e for f, e in zip(firsts[len(used) :], ends[len(used) :]))
        listed = rows[: ends[len(used) - 1]]
        assert sorted(listed) == np.flatnonzero(per_token >= 0).tolist()  # never a padding row
        for slot, first, end in zip(slots, firsts, ends):
            assert all(per_token[r] == slot for r in rows[first:end])
    _run(engine, _requests(tiny_tokenizer, [""] * 2, new_tokens=2))
    assert buffers.ints[:12].eq(0).all()
