"""Steps with prompt tokens replayed from graphs (the recording stand-in for CUDA graphs, fp32
CPU ops): the eager engine's tokens, padding that stores nothing, the step counters, and no
step of a kind that was not run before the engine was ready."""

import pytest
import torch

from lmiserve.rolling_batch.runner import graphs
from lmiserve.rolling_batch.runner.mixed_graphs import MAX_PROMPT_TOKENS, mixed_seq_buckets, prompt_token_buckets
from lmiserve.wire import SamplingParams
from tests.unit.engine.engine_helpers import make_engine, run
from tests.unit.engine.recording_graphs import RecordingBackend

LONG = list(range(5, 50))
"""A prompt whose step, alone, takes more prompt tokens than the largest mixed bucket."""
PROMPTS = ("What is Deep Learning?", "The quick brown fox " * 6, "Hi", "A b c d e f g h i j k l m n o p")


@pytest.mark.parametrize(
    "max_num_seqs,expected",
    [(1, [1]), (6, [1, 2, 4, 6]), (8, [1, 2, 4, 8]), (600, [1, 2, 4, 8, 16, 32, 64, 128, 256, 512])],
)
def test_sequence_buckets(max_num_seqs, expected):
    assert mixed_seq_buckets(max_num_seqs) == expected


@pytest.mark.parametrize(
    "limit,expected",
    [
        (512, [64, 128, 256, 512]),
        (24, [16, 32]),
        (16, [16]),
        (1000, [128, 256, 512, 1008]),
        (10**6, [256, 512, 1024, 2048]),
    ],
)
def test_prompt_token_buckets(limit, expected):
    buckets = prompt_token_buckets(limit)
    assert buckets == expected and len(buckets) <= 4 and buckets[-1] <= MAX_PROMPT_TOKENS


def _engine(monkeypatch, model_dir, **overrides):
    recorder = RecordingBackend()
    monkeypatch.setattr(graphs, "backend_for", lambda device: recorder)
    cfg = dict(max_num_seqs=4, max_num_batched_tokens=64, max_decode_step_prefill_tokens=24)
    cfg.update(overrides)
    return make_engine(model_dir, **cfg), recorder


def _arrivals(tokenizer, new_tokens=6):
    """Requests joining while others decode: steps with decodes and prompt chunks together."""
    prompts = [tokenizer(p)["input_ids"] for p in PROMPTS]
    params = SamplingParams(max_new_tokens=new_tokens)
    return {0: [("a", prompts[0], params)], 2: [("b", prompts[1], params)], 4: [("c", prompts[2], params)],
            5: [("d", prompts[3], params)]}  # fmt: skip


def test_mixed_steps_replay_with_the_eager_tokens(monkeypatch, tiny_model_dirs, tiny_tokenizer):
    model_dir = tiny_model_dirs["llama"]
    engine, recorder = _engine(monkeypatch, model_dir)
    mixed = engine.runner.mixed_graphs
    assert (mixed.seq_buckets, mixed.token_buckets) == ([1, 2, 4], [16, 32])
    assert engine.info["mixed_graphs"] == "1,2,4 x 16,32"
    captures = [size for kind, size in recorder.log if kind == "capture"]
    assert captures == [4 + 1 + 32, 4 + 1 + 16, 2 + 1 + 32, 2 + 1 + 16, 1 + 1 + 32, 1 + 1 + 16, 4, 2, 1]
    arrivals = _arrivals(tiny_tokenizer)
    tokens, _, _ = run(engine, arrivals)
    replays = [size for kind, size in recorder.log if kind == "replay"]
    assert mixed.replays >= 3 and any(size > 4 for size in replays)  # mixed buckets replayed
    assert engine.runner.graphs.replays + mixed.replays == len(replays)
    eager = make_engine(model_dir, max_num_seqs=4, max_num_batched_tokens=64, max_decode_step_prefill_tokens=24,
                        enforce_eager=True)  # fmt: skip
    assert eager.runner.graphs is None and eager.runner.mixed_graphs is None
    assert run(eager, arrivals)[0] == tokens
    assert all(len(tokens[rid][0]) == 6 for rid in "abcd")


def test_counters_count_graph_and_eager_steps(monkeypatch, tiny_model_dirs, tiny_tokenizer):
    engine, recorder = _engine(monkeypatch, tiny_model_dirs["llama"])
    assert (engine.stats().graph_steps, engine.stats().eager_steps) == (0, 0)  # the warm-up is not counted
    # nor the decode steps timed at start-up (one sequence and all 4, two runs each)
    assert sum(1 for kind, _ in recorder.log if kind == "replay") == 4
    recorder.log.clear()
    steps = 0
    arrivals = _arrivals(tiny_tokenizer)
    for step in range(200):
        for rid, prompt, params in arrivals.get(step, []):
            engine.add_request(rid, prompt, params)
        if not engine.has_work() and step > max(arrivals):
            break
        engine.step()
        steps += 1
    engine.add_request("long", LONG, SamplingParams(max_new_tokens=1))  # an eager step
    engine.step()
    steps += 1
    stats = engine.stats()
    replays = sum(1 for kind, _ in recorder.log if kind == "replay")
    assert stats.graph_steps == replays > 0
    assert stats.eager_steps == 1
    assert stats.graph_steps + stats.eager_steps == steps


def test_every_step_is_of_a_kind_run_before_ready(monkeypatch, tiny_model_dirs, tiny_tokenizer):
    """Decodes, mixed steps and long prompts alone: every step's kind and bucket was captured
    or run eagerly at start-up, so no kernel is compiled while requests wait."""
    engine, _ = _engine(monkeypatch, tiny_model_dirs["llama"])
    runner = engine.runner
    warm = set(runner.warm_keys)
    assert ("eager", "decode", False) in warm and ("eager", "prompt", False) in warm
    arrivals = _arrivals(tiny_tokenizer)
    arrivals[30] = [("long", LONG, SamplingParams(max_new_tokens=2))]
    run(engine, arrivals)
    kinds = {key[0] for key in runner.steps}
    assert kinds == {"decode", "mixed", "eager"}
    assert set(runner.steps) <= warm
    assert runner.warm_keys == warm


def test_mixed_padding_stores_nothing_in_the_kv_cache(monkeypatch, tiny_model_dirs, tiny_tokenizer):
    """A replayed mixed step (one decode, one prompt, padded to a bucket) changes only the
    blocks of its two sequences."""
    engine, recorder = _engine(monkeypatch, tiny_model_dirs["llama"])
    engine.add_request("x", tiny_tokenizer("Hi there")["input_ids"], SamplingParams(max_new_tokens=4))
    engine.step()  # the prompt
    engine.step()  # a decode, replayed
    engine.add_request("y", tiny_tokenizer("The quick brown fox")["input_ids"], SamplingParams(max_new_tokens=4))
    before = engine.runner.k_cache.clone()
    replays = engine.runner.mixed_graphs.replays
    engine.step()  # x decodes while y's prompt runs: bucket (2, 16)
    assert engine.runner.mixed_graphs.replays == replays + 1
    assert recorder.log[-1] == ("replay", 2 + 1 + 16)
    changed = (engine.runner.k_cache != before).any(dim=(0, 2, 3, 4)).nonzero().flatten().tolist()
    assert changed and set(changed) <= {b for s in engine.scheduler.running for b in s.block_table}
    assert torch.isfinite(engine.runner.k_cache).all()


def test_deterministic_mode_captures_decodes_only(monkeypatch, tiny_model_dirs):
    engine, _ = _engine(monkeypatch, tiny_model_dirs["llama"], deterministic=True)
    assert engine.runner.graphs is not None and engine.runner.mixed_graphs is None
    assert engine.info["mixed_graphs"] == "off"


def test_steps_with_adapters_replay_the_graphs(monkeypatch, tmp_path, tiny_model_dirs, tiny_tokenizer):
    """With LoRA on, the warm-up also ran a decode and a prompt with an adapter (the pool's
    holds are as they were after it); a request with an adapter then replays the graphs, which
    were captured with the LoRA launches."""
    from tests.lora_adapters import build_adapter

    model_dir = tiny_model_dirs["llama"]
    engine, _ = _engine(monkeypatch, model_dir, enable_lora=True, max_loras=1)
    runner = engine.runner
    assert {("eager", "decode", True), ("eager", "prompt", True)} <= runner.warm_keys
    assert all(not slots for slots in runner.model.lora.holds.values())
    path = build_adapter(model_dir, tmp_path / "adapter", seed=5, rank=4)
    from lmiserve import wire

    assert (
        engine.adapter_command(wire.AdapterCommand(op_id=1, action="register", name="ad", src=str(path))).kind is None
    )
    engine.add_request(
        "x", tiny_tokenizer("What is Deep Learning?")["input_ids"], SamplingParams(max_new_tokens=3), "ad"
    )
    while engine.has_work():
        engine.step()
    assert runner.eager_steps == 0 and runner.graph_steps > 0
    assert set(runner.steps) <= runner.warm_keys
