"""Tensor parallelism on the CPU: the engine with its ranks in processes of their own (gloo)
against one process and transformers ``generate``."""

import os
import signal
import threading

import pytest

from lmiserve.rolling_batch.core.engine import Engine, EngineConfig
from lmiserve.rolling_batch.runner.parallel import TensorParallelError
from lmiserve.wire import SamplingParams

from .engine_helpers import hf_greedy, run
from .test_beam_search import hf_beams

# --- the engine, ranks in processes -----------------------------------------------------------
PROMPTS = [
    "What is Deep Learning?",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Paged attention stores the key value cache in fixed-size blocks, and continuous batching "
    "lets new requests join the running batch at every step.",
    "Hi",
]


def engine(model_dir, on_rank_failure=None, **overrides) -> Engine:
    cfg = dict(model_dir=model_dir, max_num_seqs=8, max_num_batched_tokens=24, max_model_len=256)
    cfg.update(overrides)
    return Engine(EngineConfig(**cfg), on_rank_failure=on_rank_failure)


def guarded(fn, seconds: float = 120):
    """``fn()``, failing the test instead of hanging when a collective never returns."""
    result: dict = {}

    def target():
        try:
            result["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            result["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"{fn} did not return")
    if "error" in result:
        raise result["error"]
    return result.get("value")


def rank_pids(e: Engine) -> list[int]:
    return [int(p) for p in e.info["rank_pids"].split(",")]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def arrivals(tokenizer):
    ids = [tokenizer(p)["input_ids"] for p in PROMPTS]
    system = ids[2] + ids[1]  # several full blocks, shared by the last three requests
    shared = [system + tokenizer(q)["input_ids"] for q in ("What is it?", "Why?", "How so?")]
    return {
        0: [("a", ids[0], SamplingParams(max_new_tokens=16)), ("b", ids[1], SamplingParams(max_new_tokens=12))],
        2: [("c", ids[2], SamplingParams(max_new_tokens=16)), ("d", ids[3], SamplingParams(max_new_tokens=20))],
        6: [("s0", shared[0], SamplingParams(max_new_tokens=16))],
        # by now s0's prompt is in the cache: these two reuse its blocks
        24: [(f"s{i}", shared[i], SamplingParams(max_new_tokens=16)) for i in (1, 2)],
    }


@pytest.mark.parametrize("ops", ["cpu", "reference"])
@pytest.mark.parametrize("layout", ["gqa", "replicated"])
def test_two_ranks_generate_what_one_process_and_transformers_generate(tp_models, layout, ops):
    from transformers import AutoTokenizer

    model_dir = tp_models[layout]
    wanted = arrivals(AutoTokenizer.from_pretrained(model_dir))
    prompts = {rid: prompt for batch in wanted.values() for rid, prompt, _ in batch}
    lengths = {rid: params.max_new_tokens for batch in wanted.values() for rid, _, params in batch}

    # beams share their prompt's last block and copy it on write: the copies go to every rank
    beam_prompt = wanted[2][0][1]
    beam = {0: [("beam", beam_prompt, SamplingParams(max_new_tokens=8, num_beams=3, n=2, best_of=2))]}

    one = engine(model_dir, ops=ops)
    tokens_one, _, _ = run(one, wanted)
    beams_one, _, _ = run(one, beam)
    two = engine(model_dir, ops=ops, tensor_parallel_degree=2)
    try:
        assert two.info["tensor_parallel_degree"] == 2 and two.info["ops"] == ops
        assert two.runner.spec.num_heads == 2 and two.runner.spec.num_kv_heads == 1
        tokens_two, finish, _ = guarded(lambda: run(two, wanted))
        assert two.blocks.prefix_hit_tokens > 0
        beams_two, _, _ = guarded(lambda: run(two, beam))
        assert two.blocks.num_used_blocks == 0
    finally:
        guarded(two.close)
    for rid, prompt in prompts.items():
        expected = hf_greedy(model_dir, prompt, lengths[rid])
        assert tokens_two[rid][0] == tokens_one[rid][0] == expected, rid
        assert finish[rid][0] in ("length", "eos_token")
    expected_beams = hf_beams(model_dir, beam_prompt, 3, 2, 8)
    assert [beams_two["beam"][i] for i in range(2)] == [beams_one["beam"][i] for i in range(2)] == expected_beams


def test_a_replay_on_two_ranks_continues_the_first_run(tp_models):
    """A replay's prompt chunk holds generated tokens: every rank is told (with the step's prompt
    lengths) and attends them as decodes, so the continuation is the first run's."""
    prompt = [5, 17, 42, 99, 7, 63, 120, 8, 31, 250, 12, 77, 3, 190, 44]
    params = SamplingParams(max_new_tokens=20, ignore_eos=True)
    two = engine(tp_models["gqa"], tensor_parallel_degree=2)
    try:
        first = guarded(lambda: run(two, {0: [("first", prompt, params)]}))[0]["first"][0]
        for k in (1, 9, 19):
            two.add_request(f"r{k}", prompt, params, output_ids=first[:k])
            again = []
            while two.has_work():
                again += [t for d in guarded(two.step) for t in d.token_ids]
            assert first[:k] + again == first, k
        assert two.blocks.num_used_blocks == 0
    finally:
        guarded(two.close)


def test_an_indivisible_degree_is_refused_before_any_rank_starts(tp_models):
    with pytest.raises(ValueError, match="num_attention_heads 4 is not divisible by tensor_parallel_degree 3"):
        engine(tp_models["gqa"], tensor_parallel_degree=3)


def test_ranks_run_until_close_stops_them(tp_models):
    e = engine(tp_models["replicated"], tensor_parallel_degree=2)
    pids = rank_pids(e)
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):  # a process group's signals: rank 0 decides
            os.kill(pids[0], sig)
        e.add_request("a", [5, 6, 7], SamplingParams(max_new_tokens=3))
        while e.has_work():
            guarded(e.step)
        assert all(alive(pid) for pid in pids)
    finally:
        guarded(e.close)
    assert not any(alive(pid) for pid in pids)


def test_a_dead_rank_makes_the_next_step_raise(tp_models):
    e = engine(tp_models["gqa"], tensor_parallel_degree=2)
    try:
        e.add_request("a", [5, 6, 7, 8], SamplingParams(max_new_tokens=50, ignore_eos=True))
        guarded(e.step)
        os.kill(rank_pids(e)[0], signal.SIGKILL)
        with pytest.raises(TensorParallelError, match="tensor-parallel"):
            guarded(lambda: [e.step() for _ in range(10)])
        with pytest.raises(TensorParallelError):  # and every step after it
            guarded(e.step)
    finally:
        guarded(e.close)


def test_a_dead_rank_calls_on_rank_failure(tp_models):
    reasons: list[str] = []
    called = threading.Event()

    def on_failure(reason: str) -> None:
        reasons.append(reason)
        called.set()

    e = engine(tp_models["gqa"], on_rank_failure=on_failure, tensor_parallel_degree=2)
    try:
        (pid,) = rank_pids(e)
        os.kill(pid, signal.SIGKILL)
        assert called.wait(120)
        assert reasons == [f"tensor-parallel rank 1 (pid {pid}) exited with signal SIGKILL"]
        e.add_request("a", [5, 6, 7], SamplingParams(max_new_tokens=3))
        with pytest.raises(TensorParallelError, match=f"pid {pid}"):
            guarded(e.step)
    finally:
        guarded(e.close)


def test_a_step_failing_on_rank_0_stops_the_group_instead_of_desynchronising_it(tp_models):
    e = engine(tp_models["gqa"], tensor_parallel_degree=2)
    pids = rank_pids(e)
    forward = e.runner.model.forward

    def failing(*args, **kwargs):
        raise RuntimeError("injected failure")

    try:
        e.add_request("a", [5, 6, 7], SamplingParams(max_new_tokens=5))
        e.runner.model.forward = failing  # after the step went out to rank 1
        with pytest.raises(TensorParallelError, match="injected failure"):
            guarded(e.step)
        e.runner.model.forward = forward
        e.add_request("b", [5, 6, 7], SamplingParams(max_new_tokens=5))
        with pytest.raises(TensorParallelError, match="injected failure"):  # nothing more is sent
            guarded(e.step)
    finally:
        guarded(e.close)
    assert not any(alive(pid) for pid in pids)
