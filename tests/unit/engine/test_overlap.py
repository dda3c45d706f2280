"""Overlapped steps (option.async_scheduling) give the serial engine's deltas, token for token."""

from __future__ import annotations

import pytest

from lmiserve.rolling_batch.core.overlap import overlap_enabled
from lmiserve.wire import GuidedDecoding, SamplingParams

from .engine_helpers import fail_request, make_engine, run
from .overlap_helpers import both, drive, same

PROMPTS = [
    "What is Deep Learning?",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Paged attention stores the key value cache in fixed-size blocks.",
    "Hi",
    "Numbers: 1 2 3 4 5 6",
]


@pytest.mark.parametrize("deterministic", [True, False], ids=["batch-invariant", "default"])
def test_a_mixed_workload_gives_the_serial_deltas(deterministic, tiny_model_dirs, tiny_tokenizer):
    model_dir = tiny_model_dirs["llama"]
    p = [tiny_tokenizer(t)["input_ids"] for t in PROMPTS]
    # the greedy tokens of two requests, to end one with a stop token and one with an end-of-sequence token
    probe = drive(make_engine(model_dir), {0: [("s", p[0], SamplingParams(max_new_tokens=8)),
                                               ("e", p[3], SamplingParams(max_new_tokens=8))]})  # fmt: skip
    stop = probe[("s", 0)][4][0][0]
    eos = probe[("e", 0)][5][0][0]
    arrivals = {
        0: [
            ("s", p[0], SamplingParams(max_new_tokens=20, stop_token_ids=[stop], logprobs=2)),
            ("seeded", p[1], SamplingParams(max_new_tokens=14, do_sample=True, temperature=0.8, seed=11, logprobs=1)),
        ],
        1: [("e", p[3], SamplingParams(max_new_tokens=20))],
        3: [
            ("x", p[2], SamplingParams(max_new_tokens=30, ignore_eos=True)),
            ("n2", p[4], SamplingParams(max_new_tokens=9, do_sample=True, top_k=20, top_p=0.9, seed=3, n=2)),
        ],
        6: [("late", p[2] + p[3], SamplingParams(max_new_tokens=5, ignore_eos=True))],
        9: [("one", p[3], SamplingParams(max_new_tokens=1))],
    }
    options = {"deterministic": deterministic}
    serial, overlapped = both(model_dir, arrivals, abort_after={"x": 6}, eos=[eos], options=options)
    assert same(serial, overlapped, exact=deterministic)
    finish = {key: records[-1][3] for key, records in serial.items()}
    assert finish[("s", 0)] == "stop_sequence" and finish[("e", 0)] == "eos_token"
    assert finish[("late", 0)] == finish[("one", 0)] == finish[("seeded", 0)] == "length"
    assert finish[("x", 0)] is None and len(serial[("x", 0)]) == 6  # aborted
    assert serial[("n2", 0)] != serial[("n2", 1)]


def test_requests_that_end_together_and_preemption(tiny_model_dirs, tiny_tokenizer):
    """A small cache forces preemptions (of sequences whose token is in flight too) and prefix hits."""
    model_dir = tiny_model_dirs["llama"]
    system = tiny_tokenizer(PROMPTS[2])["input_ids"]
    prompts = [system + tiny_tokenizer(q)["input_ids"] for q in ("What is it?", "Why?", "How so?")]
    arrivals = {0: [(f"r{i}", q, SamplingParams(max_new_tokens=24, ignore_eos=True)) for i, q in enumerate(prompts)]}
    arrivals[2] = [("short", prompts[0][:5], SamplingParams(max_new_tokens=24, ignore_eos=True))]

    def small_cache(engine):
        engine.blocks.__init__(9, 16)
        engine.scheduler.blocks = engine.blocks
        return engine

    serial = make_engine(model_dir, max_num_batched_tokens=64, max_model_len=128, async_scheduling="false")
    overlapped = make_engine(model_dir, max_num_batched_tokens=64, max_model_len=128, async_scheduling="true")
    got_serial = drive(small_cache(serial), arrivals)
    got = drive(small_cache(overlapped), arrivals)
    assert overlapped.scheduler.num_preemptions > 0 and overlapped.overlap.serial == 0
    tokens = lambda seen: {k: [t for r in v for t in r[0]] for k, v in seen.items()}  # noqa: E731
    assert tokens(got) == tokens(got_serial)


def test_max_model_len_ends_a_sequence_that_already_runs_in_the_next_step(tiny_model_dirs):
    arrivals = {0: [("r", list(range(5, 35)), SamplingParams(max_new_tokens=100, ignore_eos=True)),
                    ("q", list(range(7, 20)), SamplingParams(max_new_tokens=100, ignore_eos=True))]}  # fmt: skip
    serial, overlapped = both(tiny_model_dirs["qwen2"], arrivals, options={"max_model_len": 40})
    assert same(serial, overlapped, exact=False)
    assert len(serial[("r", 0)]) == 10 and serial[("r", 0)][-1][3] == "length"


def test_steps_that_run_serially_still_give_the_serial_answers(tiny_model_dirs, tiny_tokenizer):
    """Beam search, guided decoding, prompt log-probabilities and penalties beside overlapped requests."""
    model_dir = tiny_model_dirs["llama"]
    p = [tiny_tokenizer(t)["input_ids"] for t in PROMPTS]
    arrivals = {
        0: [("plain", p[0], SamplingParams(max_new_tokens=16, ignore_eos=True))],
        2: [("beams", p[1], SamplingParams(max_new_tokens=6, num_beams=3, n=2, best_of=2))],
        4: [("prompt", p[2], SamplingParams(max_new_tokens=4, prompt_logprobs=2, logprobs=1))],
        5: [("guided", p[3], SamplingParams(max_new_tokens=8, guided=GuidedDecoding("regex", "(yes|no)[0-9]")))],
        7: [("penalty", p[4], SamplingParams(max_new_tokens=6, repetition_penalty=1.3, min_new_tokens=2))],
        12: [("after", p[3], SamplingParams(max_new_tokens=6, do_sample=True, seed=5))],
    }
    serial, overlapped = both(model_dir, arrivals, serial_steps=None)
    assert same(serial, overlapped, exact=False)
    text = tiny_tokenizer.decode([t for r in serial[("guided", 0)] for t in r[0]], skip_special_tokens=True)
    assert text[:-1] in ("yes", "no") and text[-1].isdigit()
    assert serial[("prompt", 0)][0][7] is not None  # the prompt's log-probabilities came
    assert any(rid == "beams" for rid, _ in serial)


def test_the_setting_turns_overlap_on_for_cuda_only_by_default():
    assert overlap_enabled("auto", "cuda:0", False) and not overlap_enabled("auto", "cpu", False)
    assert overlap_enabled("true", "cpu", False) and not overlap_enabled("false", "cuda", False)
    assert not overlap_enabled("true", "cuda", True)  # tensor parallel runs serially


def test_a_failing_request_ends_alone_with_overlap(tiny_model_dirs, tiny_tokenizer):
    model_dir = tiny_model_dirs["llama"]
    engine = make_engine(model_dir, async_scheduling="true")
    fail_request(engine, "bad")
    prompts = {rid: tiny_tokenizer(t)["input_ids"] for rid, t in (("a", PROMPTS[0]), ("bad", "Hi there"))}
    tokens, finish, deltas = run(engine, {0: [(r, q, SamplingParams(max_new_tokens=10)) for r, q in prompts.items()]})
    reference, _, _ = run(make_engine(model_dir), {0: [("a", prompts["a"], SamplingParams(max_new_tokens=10))]})
    assert finish["bad"][0] == "error" and tokens["a"] == reference["a"]
    assert engine.overlap.serial == 1 and engine.overlap.overlapped > 2  # the failing step, retried in halves
    assert engine.blocks.num_used_blocks == 0


@pytest.mark.parametrize("arch", ["qwen3"])
def test_engine_loop_with_requests_joining_between_steps(arch, tiny_model_dirs, tiny_tokenizer):
    from lmiserve import wire
    from lmiserve.rolling_batch.process.engine_process import EngineLoop

    model_dir = tiny_model_dirs[arch]
    p = [tiny_tokenizer(t)["input_ids"] for t in PROMPTS]
    joins = {0: [("a", p[0], 12)], 1: [("b", p[1], 7)], 4: [("c", p[3], 9)], 5: [("d", p[4], 3)]}

    def ask(loop, rid, prompt, n):
        params = SamplingParams(max_new_tokens=n, ignore_eos=True)
        loop.inbox.put(wire.GenerateRequest(request_id=rid, prompt_ids=prompt, params=params))

    def loop_tokens(setting):
        engine = make_engine(model_dir, async_scheduling=setting)
        out: dict[str, list[int]] = {}
        finished: set[str] = set()

        def send(msg):
            if isinstance(msg, wire.EngineStep):
                for d in msg.deltas:
                    out.setdefault(d.request_id, []).extend(d.token_ids)

        loop = EngineLoop(engine, send)
        steps = [0]
        step = engine.step

        def counted_step():
            steps[0] += 1
            deltas = step()
            finished.update(d.request_id for d in deltas if d.finish_reason)
            for request in joins.get(steps[0], []):  # they join before the next step
                ask(loop, *request)
            if len(finished) == 4 and not engine.has_work():
                loop.inbox.put(wire.Shutdown())
            return deltas

        engine.step = counted_step
        for request in joins[0]:
            ask(loop, *request)
        loop.run()
        return out

    serial = loop_tokens("false")
    assert loop_tokens("true") == serial
    assert {k: len(v) for k, v in serial.items()} == {"a": 12, "b": 7, "c": 9, "d": 3}


def test_graphs_take_their_input_ids_from_the_step_before(monkeypatch, tiny_model_dirs, tiny_tokenizer):
    """The recording stand-in for device graphs: overlapped decode steps and mixed steps replay
    graphs whose input ids are filled from the previous step's samples, and give the serial tokens."""
    from lmiserve.rolling_batch.runner import graphs

    from .recording_graphs import RecordingBackend

    monkeypatch.setattr(graphs, "backend_for", lambda device: RecordingBackend())
    model_dir = tiny_model_dirs["llama"]
    p = [tiny_tokenizer(t)["input_ids"] for t in PROMPTS]
    arrivals = {0: [("a", p[0], SamplingParams(max_new_tokens=9, do_sample=True, seed=1))],
                2: [("b", p[1], SamplingParams(max_new_tokens=6, logprobs=1))],
                4: [(str(i), q, SamplingParams(max_new_tokens=6)) for i, q in enumerate(p[2:4])]}  # fmt: skip
    options = {"max_num_seqs": 4, "max_num_batched_tokens": 64, "max_decode_step_prefill_tokens": 24}
    serial = drive(make_engine(model_dir, async_scheduling="false", **options), arrivals)
    engine = make_engine(model_dir, async_scheduling="true", **options)
    assert same(serial, drive(engine, arrivals), exact=False)
    assert engine.overlap.serial == 0
    assert engine.runner.graphs.replays > 0 and engine.runner.mixed_graphs.replays > 0


def test_the_setting_reaches_the_engine_config(tmp_path):
    from lmiserve.config import ConfigError, load_settings
    from lmiserve.rolling_batch.engine_config import EngineConfig

    def config(env):
        s = load_settings(tmp_path, env=env)
        return EngineConfig.from_settings(str(tmp_path), s.model, s.engine, device="cpu", dtype="fp32",
                                          tensor_parallel_degree=1)  # fmt: skip

    assert config({}).async_scheduling == "auto"
    assert config({"OPTION_ASYNC_SCHEDULING": "True"}).async_scheduling == "true"
    (tmp_path / "serving.properties").write_text("option.async_scheduling=false\n")
    assert config({"OPTION_ASYNC_SCHEDULING": "true"}).async_scheduling == "false"  # the file wins
    (tmp_path / "serving.properties").write_text("option.async_scheduling=sometimes\n")
    with pytest.raises(ConfigError, match="allowed: auto, true, false"):
        load_settings(tmp_path, env={})


def test_a_step_collected_after_an_idle_spell_is_not_timed(tiny_model_dirs, tiny_tokenizer):
    """The step launched beside a sequence's last one finds it ended and is collected only with
    the next request: the engine's idle time in between is not a decode step's."""
    import time

    engine = make_engine(tiny_model_dirs["llama"], async_scheduling="true")
    prompt = tiny_tokenizer(PROMPTS[0])["input_ids"]
    engine.add_request("a", prompt, SamplingParams(max_new_tokens=6, ignore_eos=True))
    while engine.has_work():
        engine.step()
    assert engine.overlap.pending is not None  # launched beside the last token, not collected
    before = engine.stats().decode_step_seconds
    time.sleep(0.5)
    engine.add_request("b", prompt, SamplingParams(max_new_tokens=2, ignore_eos=True))
    engine.step()
    stats = engine.stats()  # b's first step is in flight: the only step collected is the stale one
    assert stats.decode_step_seconds == before < 0.5
    assert all(seconds < 0.5 for _, seconds in stats.decode_curve)
