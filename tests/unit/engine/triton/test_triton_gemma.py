"""Gemma 2 (capped scores, sliding and global layers) and Gemma 3 on the CUDA ops (Triton,
interpreted on the CPU), eagerly and from the recorded step graphs: transformers' greedy tokens."""

import pytest

from lmiserve.rolling_batch.runner import graphs
from lmiserve.wire import SamplingParams
from tests.unit.engine.engine_helpers import hf_greedy, make_engine, run
from tests.unit.engine.recording_graphs import RecordingBackend

PROMPTS = ("What is Deep Learning? Deep learning is a subfield of machine learning.", "The quick brown fox " * 6, "Hi")


@pytest.fixture(scope="module")
def gemma_dirs(tmp_path_factory) -> dict:
    from tests.tiny_models import build_model

    root = tmp_path_factory.mktemp("tiny-gemma-triton")
    return {arch: build_model(root / arch, arch, seed=3) for arch in ("gemma2", "gemma3")}


@pytest.mark.parametrize("arch", ["gemma2", "gemma3"])
@pytest.mark.parametrize("eager", [True, False])
def test_gemma_on_the_cuda_ops(arch, eager, gemma_dirs, tiny_tokenizer, kernel_device, monkeypatch):
    monkeypatch.setattr(graphs, "backend_for", lambda device: RecordingBackend())
    model_dir = gemma_dirs[arch]
    prompts = [tiny_tokenizer(p)["input_ids"] for p in PROMPTS]
    arrivals = {
        0: [("a", prompts[0], SamplingParams(max_new_tokens=6))],
        2: [(str(i), p, SamplingParams(max_new_tokens=6)) for i, p in enumerate(prompts[1:], 1)],
    }
    limits = dict(max_num_seqs=4, max_num_batched_tokens=16, max_decode_step_prefill_tokens=16)
    engine = make_engine(model_dir, ops="cuda", device=kernel_device, enforce_eager=eager, **limits)
    assert engine.runner.ops.name == "cuda" and (engine.runner.graphs is None) == eager
    tokens, _, _ = run(engine, arrivals)
    if not eager:
        assert engine.runner.graphs.replays + engine.runner.mixed_graphs.replays > 0
    for rid, prompt in zip(("a", "1", "2"), prompts):
        assert tokens[rid][0] == hf_greedy(model_dir, prompt, 6), (arch, rid)
