"""The predicted first token: prompts run whole on an idle engine, in chunks of the engine's
decode-step prompt budget beside running sequences; a bound on the first token's wait admits
again once the engine is idle, however slow the chunked steps it measured last were."""

import pytest

from lmiserve.serving.admission_control import FIRST_TOKEN_WAIT, AdmissionControl, EngineLoad
from lmiserve.wire import EngineStats

# what an engine reports after a busy spell: chunks beside decodes measured slow overall, while
# a prompt alone runs at 3,000 tokens/s; 128 prompt tokens a decode step
AFTER_LOAD = dict(prefill_tokens_per_s=600.0, idle_prefill_tokens_per_s=3000.0, decode_step_prefill_tokens=128)


def control(bound=0.0, batch=32):
    return AdmissionControl(batch_size=batch, limit=100, first_token_wait=bound)


def test_an_idle_engine_runs_the_prompt_whole_at_the_idle_speed():
    c = control(bound=0.13)
    load = EngineLoad(decode_step_seconds=0.03, **AFTER_LOAD)
    assert c.predict(130, 100, load).first_token_s == pytest.approx(130 / 3000)
    assert c.decide(130, 100, None, load).admit  # the speed of the busy spell no longer counts
    # an engine that never ran a prompt alone: the speed over every step
    assert c.predict(130, 100, EngineLoad(prefill_tokens_per_s=600.0)).first_token_s == pytest.approx(130 / 600)


@pytest.mark.parametrize(
    ("tokens", "steps"),
    [(100, 1), (128, 1), (160, 1), (161, 2), (288, 2), (289, 3)],
)
def test_beside_running_sequences_a_prompt_takes_steps_of_the_reported_chunk(tokens, steps):
    c = control()
    load = EngineLoad(running=8, decode_step_seconds=0.03, **AFTER_LOAD)
    expected = 0.03 * (0.5 + steps) + tokens / 3000
    assert c.predict(tokens, 100, load).first_token_s == pytest.approx(expected)


def test_prompts_queued_ahead_share_the_chunks():
    c = control()
    load = EngineLoad(running=8, decode_step_seconds=0.03, **AFTER_LOAD)
    c.admitted("ahead", 200, 100)
    # 200 + 130 = 330 tokens: 3 steps of 128 (the rest of 74 is more than a quarter)
    assert c.predict(130, 100, load).first_token_s == pytest.approx(0.03 * 3.5 + 330 / 3000)


def test_a_bound_refuses_a_newcomer_only_while_the_chunks_ahead_are_too_many():
    c = control(bound=0.13, batch=64)  # slots to spare: only the chunks count
    load = EngineLoad(running=31, decode_step_seconds=0.03, **AFTER_LOAD)
    assert c.decide(130, 100, None, load).admit  # 1.5 steps + 43 ms = 88 ms
    for i in range(3):
        c.admitted(f"ahead{i}", 130, 100)
    refused = c.decide(130, 100, None, load)
    assert not refused.admit and refused.reason == FIRST_TOKEN_WAIT


def test_the_engine_load_reads_the_new_figures_and_tolerates_their_absence():
    stats = EngineStats(
        running=2, waiting=1, kv_blocks_used=0, kv_blocks_total=8, prefix_cache_hit_tokens=0, preemptions=0,
        prompt_tokens=0, generated_tokens=0, step_seconds=0.0, idle_prefill_tokens_per_s=3000.0,
        decode_step_prefill_tokens=128,
    )  # fmt: skip
    load = EngineLoad.of(stats)
    assert (load.idle_prefill_tokens_per_s, load.decode_step_prefill_tokens) == (3000.0, 128)
    assert EngineLoad.of(None) == EngineLoad()
