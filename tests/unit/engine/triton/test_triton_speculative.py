"""Verify steps on the CUDA ops (Triton kernels, interpreted on the CPU where there is no GPU): each
row of a verify run is attended as a decode, so verify steps replay the decode graphs, bucketed by
sequences times proposals, and keep the greedy tokens of the steps without proposals."""

from lmiserve.config.speculative import parse_speculative
from lmiserve.rolling_batch.runner import graphs
from lmiserve.wire import SamplingParams
from tests.unit.engine.engine_helpers import make_engine
from tests.unit.engine.recording_graphs import RecordingBackend

SPEC = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 2, "adaptive": false}'
PROMPT = [11, 12, 13, 14, 11, 12, 13, 14, 11, 12, 13, 14, 11, 12]


def _tokens(engine):
    engine.add_request("a", PROMPT, SamplingParams(max_new_tokens=8))
    engine.add_request("b", PROMPT[3:], SamplingParams(max_new_tokens=8, speculate=False))
    out = {"a": [], "b": []}
    while engine.has_work():
        for d in engine.step():
            out[d.request_id] += d.token_ids
    return out


def test_verify_steps_replay_decode_graphs_with_the_plain_tokens(monkeypatch, tiny_model_dirs, kernel_device):
    recorder = RecordingBackend()
    monkeypatch.setattr(graphs, "backend_for", lambda device: recorder)
    model_dir = tiny_model_dirs["llama"]
    limits = dict(max_num_seqs=2, max_num_batched_tokens=32, ops="cuda", device=kernel_device)
    plain = _tokens(make_engine(model_dir, enforce_eager=True, **limits))
    engine = make_engine(model_dir, speculative=parse_speculative(SPEC), **limits)
    assert engine.runner.graphs.buckets == [1, 2, 4, 8]  # 2 sequences, each with 3 proposals: 8 rows
    spec = _tokens(engine)
    assert spec == plain
    stats = engine.stats()
    assert stats.spec_drafts > 0
    replayed = [size for kind, size in recorder.log if kind == "replay"]
    assert any(size > 2 for size in replayed)  # verify rows beyond one per sequence
