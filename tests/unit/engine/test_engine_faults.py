"""Faults that end one sequence (a deadline passed in the queue, NaN or inf logits, memory running
out in a step) while the engine and the other sequences go on as if nothing had happened."""

import time

import pytest
import torch

from lmiserve.wire import GenerateRequest, SamplingParams

from .engine_helpers import make_engine

pytestmark = pytest.mark.usefixtures("scheduling")

PROMPTS = {
    "a": [5, 17, 42, 99, 7, 63],
    "b": [120, 8, 31, 250, 12],
    "c": [77, 3, 190, 44, 6, 210, 19],
}
PARAMS = {
    "a": SamplingParams(max_new_tokens=8, do_sample=True, temperature=0.9, top_k=50, seed=5, ignore_eos=True),
    "b": SamplingParams(max_new_tokens=8, ignore_eos=True),
    "c": SamplingParams(max_new_tokens=8, do_sample=True, seed=9, repetition_penalty=1.2, ignore_eos=True),
}
LONG = list(range(20, 60))


def collect(engine, max_steps: int = 500) -> dict[str, list]:
    out: dict[str, list] = {}
    for _ in range(max_steps):
        if not engine.has_work():
            break
        for d in engine.step():
            out.setdefault(d.request_id, []).append(d)
    return out


def tokens_of(deltas) -> list[int]:
    return [t for d in deltas for t in d.token_ids]


def alone(model_dir, names) -> dict[str, list[int]]:
    found = {}
    for name in names:
        engine = make_engine(model_dir)
        engine.add_request(name, PROMPTS[name], PARAMS[name])
        found[name] = tokens_of(collect(engine)[name])
    return found


def assert_ended(deltas, kind: str) -> None:
    last = deltas[-1]
    assert (last.finish_reason, last.error_kind) == ("error", kind)
    assert last.error
    assert sum(1 for d in deltas if d.finish_reason) == 1


# --- deadlines -------------------------------------------------------------------------------
def test_a_request_whose_deadline_has_passed_is_never_scheduled(tiny_model_dirs):
    engine = make_engine(tiny_model_dirs["llama"])
    engine.submit(GenerateRequest(request_id="late", prompt_ids=[5, 6, 7], params=SamplingParams(), deadline=1.0))
    engine.submit(
        GenerateRequest(request_id="soon", prompt_ids=[5, 6, 7], params=SamplingParams(), deadline=time.monotonic() - 1)
    )
    out = collect(engine)
    for rid in ("late", "soon"):
        assert len(out[rid]) == 1 and not out[rid][0].token_ids
        assert_ended(out[rid], "deadline")
        assert "deadline" in out[rid][0].error
    stats = engine.stats()
    assert stats.expired_in_queue == 2 and stats.prompt_tokens == 0
    assert engine.runner.eager_steps == 0 and not engine.groups and engine.blocks.num_used_blocks == 0


def test_a_request_waiting_behind_a_full_batch_expires_there(tiny_model_dirs):
    model_dir = tiny_model_dirs["llama"]
    expected = alone(model_dir, ["b"])
    engine = make_engine(model_dir, max_num_seqs=1)
    now = [1000.0]
    engine.scheduler.clock = lambda: now[0]
    engine.add_request("b", PROMPTS["b"], PARAMS["b"])
    engine.submit(GenerateRequest(request_id="queued", prompt_ids=PROMPTS["a"], params=PARAMS["a"], deadline=1010.0))
    out: dict[str, list] = {}
    for _ in range(3):
        for d in engine.step():
            out.setdefault(d.request_id, []).append(d)
    assert "queued" not in out and len(engine.scheduler.waiting) == 1
    now[0] = 1010.0
    rest = collect(engine)
    assert_ended(rest["queued"], "deadline")
    assert not tokens_of(rest["queued"])
    assert tokens_of(out["b"] + rest["b"]) == expected["b"]
    assert engine.stats().expired_in_queue == 1


def test_a_deadline_that_has_not_passed_changes_nothing(tiny_model_dirs):
    model_dir = tiny_model_dirs["llama"]
    expected = alone(model_dir, ["a"])
    engine = make_engine(model_dir)
    deadline = time.monotonic() + 3600
    engine.submit(GenerateRequest(request_id="a", prompt_ids=PROMPTS["a"], params=PARAMS["a"], deadline=deadline))
    assert tokens_of(collect(engine)["a"]) == expected["a"]
    assert engine.stats().expired_in_queue == 0


# --- NaN and inf logits --------------------------------------------------------------------
def poison(engine, values: dict[str, float], after: int = 2) -> None:
    """Logits of the named requests hold ``value`` once they have generated ``after`` tokens."""
    logits_of = engine.runner._logits

    def poisoned(hidden, rows):  # type: ignore[no-untyped-def]
        logits = logits_of(hidden, rows)
        for i, item in enumerate(rows.sampled):
            value = values.get(item.seq.request_id)
            if value is not None and item.seq.num_generated >= after:
                logits[i, 3] = value
        return logits

    engine.runner._logits = poisoned


def test_nonfinite_logits_end_their_sequence_alone(tiny_model_dirs):
    model_dir = tiny_model_dirs["llama"]
    expected = alone(model_dir, PROMPTS)
    engine = make_engine(model_dir)
    poison(engine, {"nan": float("nan"), "inf": float("inf")})
    engine.add_request("a", PROMPTS["a"], PARAMS["a"])
    engine.add_request("nan", PROMPTS["a"], PARAMS["a"])  # samples: its generator must not disturb a's
    engine.add_request("b", PROMPTS["b"], PARAMS["b"])
    engine.add_request("inf", PROMPTS["b"], PARAMS["b"])
    engine.add_request("c", PROMPTS["c"], PARAMS["c"])
    out = collect(engine)
    for rid in PROMPTS:
        assert tokens_of(out[rid]) == expected[rid]
        assert out[rid][-1].finish_reason == "length"
    for rid, like in (("nan", "a"), ("inf", "b")):
        assert tokens_of(out[rid]) == expected[like][:2]
        assert_ended(out[rid], "nonfinite")
    assert engine.stats().nonfinite_sequences == 2
    assert engine.blocks.num_used_blocks == 0 and not engine.groups


# --- out of memory ---------------------------------------------------------------------------
def run_out_of_memory(engine, when, error: Exception) -> None:
    """The first forward pass of a step that ``when`` picks raises ``error``."""
    forward = engine.runner._forward
    raised = []

    def failing(out, *args):  # type: ignore[no-untyped-def]
        if not raised and when(out):
            raised.append(out)
            raise error
        return forward(out, *args)

    engine.runner._forward = failing


def holds_long_prefill(out) -> bool:
    return any(item.seq.request_id == "long" and not item.decode for item in out.prefills)


def decodes_only_with_long(out) -> bool:
    return not out.prefills and any(
        item.seq.request_id == "long" and item.seq.num_generated >= 2 for item in out.decodes
    )


@pytest.mark.parametrize(
    "when, error",
    [
        (holds_long_prefill, torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")),
        (
            decodes_only_with_long,
            RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 GB"),
        ),
    ],
    ids=["prefill", "decode"],
)
def test_running_out_of_memory_ends_the_largest_sequence_and_retries_the_others(tiny_model_dirs, when, error):
    model_dir = tiny_model_dirs["llama"]
    expected = alone(model_dir, PROMPTS)
    engine = make_engine(model_dir, max_num_batched_tokens=128)
    run_out_of_memory(engine, when, error)
    for rid in PROMPTS:
        engine.add_request(rid, PROMPTS[rid], PARAMS[rid])
    engine.add_request("long", LONG, SamplingParams(max_new_tokens=8, ignore_eos=True))
    out = collect(engine)
    for rid in PROMPTS:
        assert tokens_of(out[rid]) == expected[rid]
        assert out[rid][-1].finish_reason == "length"
    assert_ended(out["long"], "oom")
    assert "out of memory" in out["long"][-1].error
    stats = engine.stats()
    assert stats.oom_failures == 1
    assert engine.blocks.num_used_blocks == 0 and not engine.groups


def test_a_step_undone_by_running_out_of_memory_gives_back_its_blocks(tiny_model_dirs):
    engine = make_engine(tiny_model_dirs["llama"], max_num_batched_tokens=128)
    run_out_of_memory(engine, holds_long_prefill, torch.OutOfMemoryError("out of memory"))
    engine.add_request("a", PROMPTS["a"], PARAMS["a"])
    engine.add_request("long", LONG, SamplingParams(max_new_tokens=8, ignore_eos=True))
    deltas = engine.step()
    assert [d.request_id for d in deltas] == ["long"]
    (seq,) = engine.scheduler.running
    assert seq.request_id == "a" and seq.num_computed == 0 and seq.block_table == []
    assert engine.blocks.num_used_blocks == 0


# --- measured speeds ---------------------------------------------------------------------
def test_the_stats_report_measured_prefill_and_decode_speeds(tiny_model_dirs):
    engine = make_engine(tiny_model_dirs["llama"])
    assert engine.stats().prefill_tokens_per_s == 0.0 and engine.stats().decode_step_seconds == 0.0
    engine.add_request("a", PROMPTS["a"], PARAMS["a"])
    engine.add_request("b", PROMPTS["b"], PARAMS["b"])
    collect(engine)
    stats = engine.stats()
    assert stats.prefill_tokens_per_s > 0.0
    assert stats.decode_step_seconds > 0.0


def test_the_engine_starts_with_a_decode_curve_timed_at_start_up(tiny_model_dirs):
    """Two padding decode steps timed before the first request: one sequence and the larger
    batch, so admission control knows from the first burst how a step grows."""
    engine = make_engine(tiny_model_dirs["llama"])
    curve = engine.stats().decode_curve
    batches = [b for b, _ in curve]
    assert batches == [1.0, float(min(engine.config.max_num_seqs, 32))]
    assert all(t > 0.0 for _, t in curve)
    assert "1: " in engine.info["decode_step_ms"]


def test_interpreted_device_kernels_are_not_timed(tiny_model_dirs):
    pytest.importorskip("triton")
    engine = make_engine(tiny_model_dirs["llama"], ops="cuda", device="cpu")
    assert engine.stats().decode_curve == [] and engine.info["decode_step_ms"] == "not timed"


def test_a_decode_step_that_fails_at_start_up_leaves_the_curve_empty(tiny_model_dirs, monkeypatch):
    """The timing is a figure for admission control, never a reason for the engine not to start."""
    from lmiserve.rolling_batch.runner.model_runner import ModelRunner

    def broken(self, arrays):  # type: ignore[no-untyped-def]
        raise RuntimeError("no padding steps here")

    monkeypatch.setattr(ModelRunner, "run_eager", broken)
    engine = make_engine(tiny_model_dirs["llama"])
    assert engine.stats().decode_curve == [] and engine.info["decode_step_ms"] == "not timed"
