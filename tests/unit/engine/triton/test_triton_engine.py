"""The engine on the CUDA ops (Triton kernels, interpreted on the CPU) and its decode and mixed
step graphs (the recording stand-in for CUDA graphs): transformers' greedy tokens, token for token."""

import pytest

from lmiserve.rolling_batch.runner import graphs
from lmiserve.wire import SamplingParams
from tests.unit.engine.engine_helpers import hf_greedy, make_engine, run
from tests.unit.engine.recording_graphs import RecordingBackend

PROMPTS = ("What is Deep Learning?", "The quick brown fox " * 6, "Hi")


def _arrivals(tokenizer, new_tokens=6):
    prompts = [tokenizer(p)["input_ids"] for p in PROMPTS]
    return prompts, {
        0: [("a", prompts[0], SamplingParams(max_new_tokens=new_tokens))],
        2: [(str(i), p, SamplingParams(max_new_tokens=new_tokens)) for i, p in enumerate(prompts[1:], 1)],
    }


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_cuda_ops_give_transformers_greedy_tokens(arch, tiny_model_dirs, tiny_tokenizer, kernel_device):
    """Decodes beside prompt chunks (a 16-token budget chunks the long prompt), one attention
    launch per layer for the whole step."""
    model_dir = tiny_model_dirs[arch]
    prompts, arrivals = _arrivals(tiny_tokenizer)
    engine = make_engine(model_dir, ops="cuda", device=kernel_device, max_num_batched_tokens=16, enforce_eager=True)
    assert engine.runner.ops.name == "cuda" and engine.runner.graphs is None
    tokens, _, _ = run(engine, arrivals)
    for rid, prompt in zip(("a", "1", "2"), prompts):
        assert tokens[rid][0] == hf_greedy(model_dir, prompt, 6), rid


def test_decode_graphs_replay_padded_buckets_with_the_eager_tokens(
    monkeypatch, tiny_model_dirs, tiny_tokenizer, kernel_device
):
    recorder = RecordingBackend()
    monkeypatch.setattr(graphs, "backend_for", lambda device: recorder)
    model_dir = tiny_model_dirs["llama"]
    prompts, arrivals = _arrivals(tiny_tokenizer, new_tokens=5)
    limits = dict(max_num_seqs=6, max_num_batched_tokens=64, max_decode_step_prefill_tokens=16)
    engine = make_engine(model_dir, ops="cuda", device=kernel_device, **limits)
    assert engine.runner.graphs.buckets == [1, 2, 4, 6]
    assert engine.info["decode_graphs"] == "1,2,4,6"
    assert engine.info["mixed_graphs"] == "1,2,4,6 x 16"
    captures = [e for e in recorder.log if e[0] == "capture"]
    assert captures == [("capture", b + 1 + 16) for b in (6, 4, 2, 1)] + [("capture", b) for b in (6, 4, 2, 1)]
    timed = [size for kind, size in recorder.log if kind == "replay"]
    # the decode steps timed at start-up, two runs each (not under the interpreter)
    assert timed == ([1, 1, 6, 6] if kernel_device.startswith("cuda") else [])
    tokens, _, _ = run(engine, arrivals)
    replays = [size for kind, size in recorder.log if kind == "replay"][len(timed) :]
    # "a"'s prompt in bucket (1, 16), its decode; the others' prompt chunks beside decodes in
    # bucket (2, 16); then decodes
    assert replays[:2] == [1 + 1 + 16, 1] and 2 + 1 + 16 in replays and 2 in replays
    mixed = engine.runner.mixed_graphs.replays  # prompts beside decodes: the attention launch of a bucket
    assert mixed > 0 and engine.runner.graphs.replays + mixed == len(timed) + len(replays)
    eager = make_engine(model_dir, ops="cuda", device=kernel_device, enforce_eager=True, **limits)
    assert eager.runner.graphs is None
    assert run(eager, arrivals)[0] == tokens
    for rid, prompt in zip(("a", "1", "2"), prompts):
        assert tokens[rid][0] == hf_greedy(model_dir, prompt, 5), rid


def test_graph_padding_stores_nothing_in_the_kv_cache(monkeypatch, tiny_model_dirs, tiny_tokenizer, kernel_device):
    """Padded rows carry slot -1: a replay padded from three sequences to four changes only
    the blocks of the three."""
    import torch

    recorder = RecordingBackend()
    monkeypatch.setattr(graphs, "backend_for", lambda device: recorder)
    engine = make_engine(
        tiny_model_dirs["llama"], ops="cuda", device=kernel_device, max_num_seqs=4, max_num_batched_tokens=64,
        max_decode_step_prefill_tokens=16,
    )  # fmt: skip
    prompt = tiny_tokenizer("Hi there")["input_ids"]
    for rid in "xyz":
        engine.add_request(rid, prompt, SamplingParams(max_new_tokens=3))
    engine.step()  # the three prompts
    before = engine.runner.k_cache.clone()
    engine.step()  # three decodes, replayed in the graph of four
    assert recorder.log[-1] == ("replay", 4)
    changed = (engine.runner.k_cache != before).any(dim=(0, 2, 3, 4)).nonzero().flatten().tolist()
    assert changed and set(changed) <= {b for s in engine.scheduler.running for b in s.block_table}
    assert torch.isfinite(engine.runner.k_cache).all()


def test_deterministic_mode_on_the_cuda_ops(tiny_model_dirs, tiny_tokenizer, kernel_device):
    """bf16, one Triton attention launch per step: the same tokens alone, in a batch of four
    under a small step budget, and with the prefix cached."""
    model_dir = tiny_model_dirs["qwen3"]
    prompt = tiny_tokenizer("The quick brown fox jumps over the lazy dog while the cat sleeps")["input_ids"]
    others = [tiny_tokenizer(t)["input_ids"] for t in ("Hi", "What is Deep Learning?", "A b c d e f g")]
    params = SamplingParams(max_new_tokens=6)

    def target(budget, batch, warm=False):
        engine = make_engine(
            model_dir, ops="cuda", device=kernel_device, dtype="bf16", deterministic=True,
            max_num_batched_tokens=budget, enforce_eager=True,
        )  # fmt: skip
        if warm:
            run(engine, {0: [("w", prompt, SamplingParams(max_new_tokens=1))]})
        arrivals = {0: [(f"o{i}", p, params) for i, p in enumerate(batch)] + [("t", prompt, params)]}
        return run(engine, arrivals)[0]["t"][0]

    alone = target(512, [])
    assert target(16, others) == alone
    assert target(16, [], warm=True) == alone


def test_deterministic_mode_replays_mixed_and_decode_graphs(
    monkeypatch, tiny_model_dirs, tiny_tokenizer, kernel_device
):
    """On the CUDA ops deterministic mode captures steps with prompt tokens too: the target's
    greedy tokens from graphs, beside other requests under a 16-token step budget, are those
    of the target alone in eager steps of a 512-token budget. In fp32, which keeps the slow
    interpreted element-wise kernels out of it: the bf16 bits are the test above's and the
    kernels' own (test_triton_deterministic, test_invariant_matmul)."""
    recorder = RecordingBackend()
    monkeypatch.setattr(graphs, "backend_for", lambda device: recorder)
    model_dir = tiny_model_dirs["llama"]
    prompt = tiny_tokenizer("The quick brown fox jumps over the lazy dog while the cat sleeps")["input_ids"]
    others = [tiny_tokenizer(t)["input_ids"] for t in ("Hi", "What is Deep Learning?")]
    params = SamplingParams(max_new_tokens=5)
    common = dict(ops="cuda", device=kernel_device, dtype="fp32", deterministic=True, max_num_seqs=3)

    alone = make_engine(model_dir, max_num_batched_tokens=512, enforce_eager=True, **common)
    want = run(alone, {0: [("t", prompt, params)]})[0]["t"][0]
    engine = make_engine(model_dir, max_num_batched_tokens=16, max_decode_step_prefill_tokens=16, **common)
    assert engine.runner.mixed_graphs is not None and engine.runner.graphs is not None
    arrivals = {0: [("o0", others[0], params)], 1: [("t", prompt, params), ("o1", others[1], params)]}
    assert run(engine, arrivals)[0]["t"][0] == want
    assert engine.runner.mixed_graphs.replays > 0 and engine.runner.graphs.replays > 0
