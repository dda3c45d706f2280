"""Admission control: the queue limit, the predicted time to a request's end (its first token, then
its tokens at the step time of the batch it joins) against its deadline, Retry-After, the ledger of
requests admitted but not started, and fair shares. The first token's own bound:
test_first_token_wait.py."""

import time

import pytest

from lmiserve.serving.admission_control import (
    PREDICTED_DELAY,
    QUEUE_FULL,
    AdmissionControl,
    EngineLoad,
)
from lmiserve.wire import EngineStats
from tests.unit.admission_helpers import FAST, control


def learned(c: AdmissionControl, tokens: int) -> AdmissionControl:
    """``c`` once a request of ``tokens`` tokens has ended: the typical length is known."""
    c.admitted("ended", 1, tokens)
    c.progressed("ended", tokens)
    c.forget("ended")
    return c


def test_an_engine_that_has_measured_nothing_yet_admits():
    c = control()
    for i in range(50):
        c.admitted(f"r{i}", 10_000, 100)
    assert c.decide(10_000, 100, budget=0.5, load=EngineLoad(waiting=50)).admit


def test_an_idle_engine_predicts_the_prompts_prefill():
    prediction = control().predict(500, 100, FAST)
    assert prediction.first_token_s == pytest.approx(0.5)
    assert prediction.total_s == pytest.approx(0.5 + 100 * 0.01)


def test_a_request_predicted_to_end_after_its_deadline_is_refused():
    # first token at 0.5 s, last at 1.5 s
    decision = learned(control(), 100).decide(500, 100, budget=1.0, load=FAST)
    assert not decision.admit and decision.reason == PREDICTED_DELAY and decision.retry_after == 1
    assert decision.prediction.first_token_s == pytest.approx(0.5)
    assert learned(control(), 100).decide(500, 100, budget=1.8, load=FAST).admit  # 15% kept in reserve


def test_until_a_request_has_ended_only_the_first_token_counts():
    """max_new_tokens is only a bound: a chat request without max_tokens may have thousands."""
    assert control().decide(500, 8000, budget=1.0, load=FAST).admit
    assert not control().decide(1000, 8000, budget=1.0, load=FAST).admit  # its first token at 1 s


def test_each_admission_stretches_the_step_of_a_busy_batch():
    c = control(batch=64)
    busy = EngineLoad(running=10, prefill_tokens_per_s=1000.0, decode_step_seconds=0.1)
    # an 11th sequence: steps of 0.11 s for its 100 tokens
    assert c.predict(0, 100, busy).total_s == pytest.approx(100 * 0.1 * 11 / 10)
    assert not learned(c, 100).decide(0, 100, budget=10.5, load=busy).admit
    # where sequences end after about 20 tokens: 20 steps of 0.11 s
    short = learned(control(batch=64), 20)
    assert short.predict(0, 100, busy).total_s == pytest.approx(20 * 0.11)
    assert short.decide(0, 100, budget=10.5, load=busy).admit


def test_the_prompts_admitted_but_not_started_are_queued_ahead():
    """A burst between two engine steps: the engine reported nothing waiting, the ledger knows."""
    c = control(batch=100)
    for i in range(3):
        c.admitted(f"r{i}", 1000, 10)
    assert c.predict(1000, 10, FAST).first_token_s == pytest.approx(4.0)
    decision = c.decide(1000, 10, budget=2.0, load=FAST)
    assert not decision.admit and decision.reason == PREDICTED_DELAY
    assert decision.retry_after == 3  # 4.1 s predicted (10 tokens after 4 s of prompts), 2 s allowed
    c.progressed("r0", 1)  # r0 has its first token: no longer ahead in the queue
    assert c.predict(1000, 10, FAST).first_token_s == pytest.approx(3.0)


def test_retry_after_rounds_up_and_is_at_least_one_second():
    c = control(batch=100)
    c.admitted("a", 1050, 10)
    decision = c.decide(1000, 10, budget=2.0, load=FAST)  # 2.05 s predicted
    assert not decision.admit and decision.retry_after == 1
    c.admitted("b", 1500, 10)
    assert c.decide(1000, 10, budget=2.0, load=FAST).retry_after == 2  # 3.55 s predicted


def test_waiting_sequences_beyond_the_ledger_are_other_processes_prompts_of_the_mean_length():
    c = control(batch=100)
    c.admitted("a", 1000, 10)
    load = EngineLoad(waiting=3, prefill_tokens_per_s=1000.0, decode_step_seconds=0.01)
    # one own prompt of 1000 tokens and two more of the same length, then this one
    assert c.predict(1000, 10, load).first_token_s == pytest.approx(4.0)


def test_a_full_batch_waits_for_the_running_sequence_that_ends_first():
    c = control(batch=2)
    c.admitted("a", 0, 100)
    c.admitted("b", 0, 300)
    c.progressed("a", 50)  # 50 tokens left
    c.progressed("b", 100)  # 200 left
    load = EngineLoad(running=2, prefill_tokens_per_s=1e9, decode_step_seconds=0.01)
    assert c.predict(0, 10, load).first_token_s == pytest.approx(0.5)
    decision = c.decide(0, 10, budget=0.2, load=load)
    assert not decision.admit and decision.retry_after == 1
    c.admitted("q", 0, 10)  # queued ahead: it takes a's slot, this one waits for b's
    assert c.predict(0, 10, load).first_token_s == pytest.approx(2.0)


def test_beyond_one_batch_each_batch_of_queued_requests_runs_its_max_new_tokens():
    c = control(batch=1)
    c.admitted("a", 0, 10)
    c.progressed("a", 1)  # 9 left
    for i in range(3):
        c.admitted(f"q{i}", 0, 100)
    load = EngineLoad(running=1, prefill_tokens_per_s=1e9, decode_step_seconds=0.1)
    # a ends after 9 steps; the three queued requests then run 100 steps each, one at a time
    assert c.predict(0, 100, load).first_token_s == pytest.approx((9 + 300) * 0.1)


def test_running_sequences_of_other_processes_owe_what_this_ones_owe():
    c = control(batch=2)
    c.admitted("a", 0, 40)
    c.progressed("a", 20)
    load = EngineLoad(running=2, prefill_tokens_per_s=1e9, decode_step_seconds=0.1)
    assert c.predict(0, 10, load).first_token_s == pytest.approx(2.0)


def test_running_sequences_are_expected_to_end_at_the_length_sequences_ended_at_before():
    """Stop tokens end most sequences long before max_new_tokens: once some have ended, a
    running sequence is expected to stop at their typical length."""
    c = control(batch=1)
    assert c.typical_tokens is None
    for i in range(3):  # three requests that stopped after 20 of their 1000 tokens
        c.admitted(f"done{i}", 0, 1000)
        c.progressed(f"done{i}", 20)
        c.forget(f"done{i}")
    assert c.typical_tokens == pytest.approx(20)
    c.admitted("a", 0, 1000)
    c.progressed("a", 5)
    load = EngineLoad(running=1, prefill_tokens_per_s=1e9, decode_step_seconds=0.1)
    assert c.predict(0, 10, load).first_token_s == pytest.approx(1.5)  # 15 more tokens, not 995
    c.progressed("a", 30)  # past the typical length: it may end any step
    assert c.predict(0, 10, load).first_token_s == pytest.approx(0.0)


def test_a_request_that_never_started_teaches_no_length():
    c = control()
    c.admitted("shed", 100, 1000)
    c.prune(set())
    assert c.typical_tokens is None


def test_the_queue_limit_refuses_whatever_the_prediction():
    c = control(limit=2)
    c.admitted("a", 1, 10)
    c.admitted("b", 1, 10)
    decision = c.decide(1, 10, budget=None, load=EngineLoad())
    assert not decision.admit and decision.reason == QUEUE_FULL and decision.retry_after == 1
    assert not control(limit=2).decide(1, 10, None, EngineLoad(), in_flight=2).admit


def test_the_queue_limit_retry_after_is_when_a_running_sequence_ends():
    c = control(limit=1)
    c.admitted("a", 1, 100)
    c.progressed("a", 10)
    decision = c.decide(1, 10, budget=None, load=EngineLoad(decode_step_seconds=0.05))
    assert decision.retry_after == 5  # 90 tokens * 0.05 s


def test_turned_off_only_the_queue_limit_refuses():
    c = control(batch=100, predictive=False)
    c.admitted("a", 100_000, 10)
    assert c.decide(1000, 10, budget=0.1, load=FAST).admit


def test_no_deadline_is_never_late():
    c = control(batch=100)
    c.admitted("a", 100_000, 10)
    assert c.decide(1000, 10, budget=None, load=FAST).admit


def test_pruning_forgets_what_is_no_longer_in_flight():
    c = control(batch=100)
    c.admitted("a", 5000, 10)
    c.admitted("b", 5000, 10)
    c.prune({"b"})
    assert len(c) == 1
    assert c.predict(1000, 10, FAST).first_token_s == pytest.approx(6.0)
    c.forget("b")
    assert len(c) == 0


def test_the_load_of_engine_stats():
    stats = EngineStats(
        running=3,
        waiting=4,
        kv_blocks_used=0,
        kv_blocks_total=1,
        prefix_cache_hit_tokens=0,
        preemptions=0,
        prompt_tokens=0,
        generated_tokens=0,
        step_seconds=0.0,
        prefill_tokens_per_s=2000.0,
        decode_step_seconds=0.02,
    )
    assert EngineLoad.of(stats) == EngineLoad(3, 4, 2000.0, 0.02)
    assert EngineLoad.of(None) == EngineLoad()


# --- fairness ---------------------------------------------------------------------------


def flooded(limit=8):
    """The flooding tenant holds every request the queue allows."""
    c = control(batch=4, limit=limit)
    for i in range(limit):
        c.admitted(f"f{i}", 10, 10, tenant="flood")
    return c


def test_a_tenant_below_its_share_is_admitted_when_the_queue_is_full():
    c = flooded()
    assert not c.decide(10, 10, None, EngineLoad(), tenant="flood").admit
    refused = c.decide(10, 10, None, EngineLoad(), tenant="flood")
    assert refused.reason == QUEUE_FULL and refused.retry_after >= 1
    for i in range(4):  # its share: 8 requests between two tenants
        assert c.decide(10, 10, None, EngineLoad(), tenant="light").admit
        c.admitted(f"l{i}", 10, 10, tenant="light")
    assert not c.decide(10, 10, None, EngineLoad(), tenant="light").admit
    assert c.tenant_requests("light") == 4


def test_a_tenant_below_its_share_is_admitted_when_the_delay_is_too_long():
    c = control(batch=100, limit=8)
    for i in range(4):
        c.admitted(f"f{i}", 1000, 10, tenant="flood")
    assert c.decide(1000, 10, budget=1.0, load=FAST, tenant="flood").reason == PREDICTED_DELAY
    assert c.decide(1000, 10, budget=1.0, load=FAST, tenant="light").admit


def test_without_tenants_or_with_one_there_is_no_share_to_claim():
    c = flooded()
    assert not c.decide(10, 10, None, EngineLoad()).admit
    assert not c.decide(10, 10, None, EngineLoad(), tenant="flood").admit


def test_a_newcomer_in_time_is_refused_when_it_would_make_an_admitted_request_late():
    c = learned(control(batch=64), 100)
    busy = EngineLoad(running=10, prefill_tokens_per_s=1000.0, decode_step_seconds=0.1)
    now = time.monotonic()
    for i in range(10):
        c.admitted(f"r{i}", 10, 100, deadline=now + 12.0)  # 10.2 s once 15% is kept in reserve
        c.progressed(f"r{i}", 1)
    # each owes 99 tokens: 9.9 s at 0.1 s a step, 10.89 s at 0.11 (an 11th sequence): late
    assert c.stretched(busy, now=now) == pytest.approx(9.9)
    assert c.stretched(busy, now=now - 1.0) is None  # more slack: in time either way
    # its own 20 tokens would end in time (2.2 s of 30); theirs would not
    decision = c.decide(10, 20, budget=30.0, load=busy)
    assert not decision.admit and decision.reason == PREDICTED_DELAY and decision.retry_after == 10
    assert "miss its deadline" in decision.detail


def test_a_request_late_already_does_not_block_admissions():
    c = control(batch=64)
    busy = EngineLoad(running=2, prefill_tokens_per_s=1000.0, decode_step_seconds=0.1)
    c.admitted("doomed", 10, 100, deadline=1000.0 + 1.0)  # 10 s of tokens left, 1 s of time
    c.progressed("doomed", 1)
    assert c.stretched(busy, now=1000.0) is None


def test_a_stale_report_of_a_small_batch_does_not_inflate_the_step():
    """Just after a restart the engine may report one sequence running while this process knows of
    ten (the others are being computed again): the step is scaled to the ten, not to one."""
    c = control(batch=64)
    stale = EngineLoad(running=1, prefill_tokens_per_s=1000.0, decode_step_seconds=0.1)
    now = time.monotonic()
    for i in range(10):
        c.admitted(f"r{i}", 10, 100, deadline=now + 120.0)
        c.progressed(f"r{i}", 1)
    assert c.stretched(stale, now=now) is None
    assert c.predict(0, 20, stale).total_s == pytest.approx(20 * 0.1 * 11 / 10)
    assert c.decide(10, 20, budget=120.0, load=stale).admit
