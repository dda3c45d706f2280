"""How admission control scales the step time with the batch: along the engine's decode curve
(decode-only steps timed by batch), in proportion only while the curve has fewer than two
points. A GPU's step hardly grows with the batch: scaling it in proportion refused every request
of a burst that followed a quiet spell."""

import pytest

from lmiserve.serving.admission_control import PREDICTED_DELAY, AdmissionControl, EngineLoad
from lmiserve.serving.engine_load import step_scale
from tests.unit.engine_stats import stats

GPU_CURVE = ((1.0, 0.002), (32.0, 0.003))
"""A step of 32 sequences half as long again as one of a single sequence."""


def test_without_two_points_the_step_grows_in_proportion():
    assert step_scale(EngineLoad(), 64, 8) == 8.0
    assert step_scale(EngineLoad(decode_curve=((8.0, 0.01),)), 64, 8) == 8.0


def test_a_batch_no_larger_than_the_running_one_is_not_scaled():
    assert step_scale(EngineLoad(decode_curve=GPU_CURVE), 8, 8) == 1.0
    assert step_scale(EngineLoad(decode_curve=GPU_CURVE), 4, 8) == 1.0
    assert step_scale(EngineLoad(decode_curve=GPU_CURVE), 64, 0) == 1.0


def test_between_points_the_curve_is_a_straight_line():
    load = EngineLoad(decode_curve=((1.0, 0.010), (8.0, 0.024), (32.0, 0.048)))
    assert step_scale(load, 8, 1) == pytest.approx(2.4)
    assert step_scale(load, 20, 8) == pytest.approx(0.036 / 0.024)
    assert step_scale(load, 4, 2) == pytest.approx(0.016 / 0.012)


def test_past_the_last_point_it_runs_on_the_last_two_points_line_and_never_shrinks():
    assert step_scale(EngineLoad(decode_curve=GPU_CURVE), 125, 1) == pytest.approx((0.003 + 93 * 0.001 / 31) / 0.002)
    shrinking = EngineLoad(decode_curve=((1.0, 0.004), (32.0, 0.003)))
    assert step_scale(shrinking, 256, 1) == 1.0


def test_a_dip_in_the_curve_is_raised_to_the_points_before_it():
    """A point below a smaller batch's (noise, or measured under another load) would make every
    ratio over it too large."""
    dip = EngineLoad(decode_curve=((1.0, 0.004), (8.0, 0.0001), (32.0, 0.006)))
    assert step_scale(dip, 32, 8) == pytest.approx(1.5)
    assert step_scale(dip, 8, 1) == 1.0


def test_a_burst_after_a_quiet_spell_is_admitted_on_a_flat_curve():
    """One sequence running, 127 admitted and not started, the last steps measured 10 ms (prompts
    were computed beside the decodes): the 128th request of the burst, 128 tokens, 120 s."""

    def burst(curve):
        c = AdmissionControl(batch_size=256, limit=1000)
        c.admitted("ended", 1, 128)
        c.progressed("ended", 128)
        c.forget("ended")  # sequences run 128 tokens here
        c.admitted("running", 190, 128)
        c.progressed("running", 1)
        for i in range(127):
            c.admitted(f"q{i}", 190, 128)
        load = EngineLoad(running=1, idle_prefill_tokens_per_s=50_000.0, decode_step_seconds=0.01, decode_curve=curve)
        return c.decide(190, 128, budget=120.0, load=load)

    decision = burst(GPU_CURVE)
    assert decision.admit
    assert decision.prediction.total_s < 10.0
    refused = burst(())  # in proportion: 129 times the step, 1.3 s a token
    assert not refused.admit and refused.reason == PREDICTED_DELAY


def test_the_load_carries_the_engines_curve():
    load = EngineLoad.of(stats(running=1, decode_curve=[(1.0, 0.002), (32.0, 0.003)]))
    assert load.decode_curve == GPU_CURVE
