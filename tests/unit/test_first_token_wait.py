"""Admission control's bound on the predicted wait for a request's first token
(option.max_first_token_wait): refused past it, deadline or not, with its own reason."""

import pytest

from lmiserve.serving.admission_control import FIRST_TOKEN_WAIT, PREDICTED_DELAY, EngineLoad
from tests.unit.admission_helpers import FAST, control


def test_a_first_token_predicted_past_the_bound_is_refused_deadline_or_not():
    c = control(batch=100, first_token_wait=2.0)
    for i in range(2):
        c.admitted(f"r{i}", 1000, 10)
    # 3 s of prompts (two ahead and its own) before its first token: 1 s past the bound
    for budget in (None, 100.0):
        decision = c.decide(1000, 10, budget=budget, load=FAST)
        assert not decision.admit and decision.reason == FIRST_TOKEN_WAIT and decision.retry_after == 1
        assert decision.prediction.first_token_s == pytest.approx(3.0)
        assert "max_first_token_wait" in decision.detail
    c.admitted("r2", 1500, 10)
    assert c.decide(1000, 10, budget=None, load=FAST).retry_after == 3  # 4.5 s predicted: ceil(2.5)


def test_a_first_token_within_the_bound_is_admitted():
    c = control(batch=100, first_token_wait=2.0)
    c.admitted("r0", 1000, 10)
    assert c.decide(900, 10, budget=None, load=FAST).admit  # 1.9 s
    assert c.decide(1000, 10, budget=100.0, load=FAST).admit  # 2 s: at the bound, not past it


def test_a_first_token_waiting_for_a_batch_slot_counts_against_the_bound():
    c = control(batch=1, first_token_wait=0.3)
    c.admitted("a", 0, 100)
    c.progressed("a", 50)  # its slot frees after 50 more steps
    load = EngineLoad(running=1, prefill_tokens_per_s=1e9, decode_step_seconds=0.01)
    decision = c.decide(1, 10, budget=None, load=load)
    assert not decision.admit and decision.reason == FIRST_TOKEN_WAIT
    assert decision.prediction.first_token_s == pytest.approx(0.5)


def test_a_bound_of_zero_bounds_nothing():
    c = control(batch=100)
    c.admitted("a", 100_000, 10)
    assert c.decide(1000, 10, budget=None, load=FAST).admit
    assert c.decide(1000, 10, budget=1000.0, load=FAST).admit


def test_turned_off_the_prediction_bounds_no_first_token():
    c = control(batch=100, predictive=False, first_token_wait=0.1)
    c.admitted("a", 100_000, 10)
    assert c.decide(1000, 10, budget=None, load=FAST).admit


def test_a_request_past_its_deadline_is_refused_for_the_deadline_first():
    c = control(batch=100, first_token_wait=0.5)
    c.admitted("a", 2000, 10)
    assert c.decide(1000, 10, budget=1.0, load=FAST).reason == PREDICTED_DELAY  # 3 s: past both


def test_an_engine_that_has_measured_nothing_yet_bounds_no_first_token():
    c = control(first_token_wait=0.1)
    for i in range(50):
        c.admitted(f"r{i}", 10_000, 100)
    assert c.decide(10_000, 100, budget=None, load=EngineLoad(waiting=50)).admit


def test_a_tenant_below_its_share_is_admitted_past_the_first_token_bound():
    c = control(batch=100, limit=8, first_token_wait=1.5)
    for i in range(4):
        c.admitted(f"f{i}", 1000, 10, tenant="flood")
    assert c.decide(1000, 10, budget=None, load=FAST, tenant="flood").reason == FIRST_TOKEN_WAIT
    assert c.decide(1000, 10, budget=None, load=FAST, tenant="light").admit
