"""The engine's measured speeds: a step with prompts beside decodes measures both, since it is
what the decoding sequences' next token took."""

import pytest

from lmiserve.rolling_batch.core.speeds import StepSpeeds


def test_a_mixed_step_measures_prefill_and_the_decodes_next_token():
    speeds = StepSpeeds()
    speeds.record(0, 0.01, decodes=8)
    assert speeds.decode_step_seconds == pytest.approx(0.01)
    speeds.record(500, 0.1, decodes=8)  # prompts beside the decodes: their token took 0.1 s
    assert speeds.prefill_tokens_per_s == pytest.approx(5000.0)
    assert speeds.decode_step_seconds == pytest.approx(0.01 + 0.2 * (0.1 - 0.01))


def test_a_step_of_prompts_alone_does_not_measure_decoding():
    speeds = StepSpeeds()
    speeds.record(0, 0.02, decodes=1)
    speeds.record(1000, 0.5, decodes=0)
    assert speeds.decode_step_seconds == pytest.approx(0.02)
    assert speeds.prefill_tokens_per_s == pytest.approx(2000.0)


def test_the_idle_prompt_speed_comes_from_steps_in_which_nothing_decodes():
    speeds = StepSpeeds()
    speeds.record(100, 0.1, decodes=8)  # a chunk beside decodes: not the idle speed
    assert speeds.idle_prefill_tokens_per_s == 0.0
    speeds.record(400, 0.1, decodes=0)
    assert speeds.idle_prefill_tokens_per_s == pytest.approx(4000.0)
    speeds.record(100, 0.1, decodes=8)
    assert speeds.idle_prefill_tokens_per_s == pytest.approx(4000.0)
    assert speeds.prefill_tokens_per_s == pytest.approx(1000.0 + 0.2 * (4000.0 - 1000.0) + 0.2 * (1000.0 - 1600.0))


def test_decode_only_steps_draw_the_decode_curve_by_band_of_batch_sizes():
    speeds = StepSpeeds()
    speeds.record(0, 0.010, decodes=1)
    speeds.record(0, 0.020, decodes=8)
    speeds.record(0, 0.030, decodes=12)  # the same band as 8 (8..15): smoothed into its point
    speeds.record(500, 0.5, decodes=32)  # prompts beside: not a point of the curve
    (b1, t1), (b8, t8) = speeds.decode_curve()
    assert (b1, t1) == (1.0, pytest.approx(0.010))
    assert b8 == pytest.approx(8 + 0.2 * 4) and t8 == pytest.approx(0.020 + 0.2 * 0.010)


def test_points_seeded_at_start_up_are_smoothed_into_by_real_steps():
    speeds = StepSpeeds()
    speeds.seed(32, 0.040)
    speeds.record(0, 0.060, decodes=32)
    assert speeds.decode_curve() == [(32.0, pytest.approx(0.044))]
    assert speeds.decode_step_seconds == pytest.approx(0.060)  # seeds are not the current step
