"""The engine's cumulative counters in the API process: they survive an engine's restart and never go back."""

from types import SimpleNamespace

from lmiserve.serving.engine_model import EngineModel
from lmiserve.serving.snapshot import EngineCounters, engine_snapshot
from tests.unit.engine_stats import stats


def counts(hits: int, preemptions: int, graph_steps: int = 0, eager_steps: int = 0, **more: int) -> dict[str, int]:
    return {"prefix_cache_hit_tokens": hits, "preemptions": preemptions, "graph_steps": graph_steps,
            "eager_steps": eager_steps, "expired_in_queue": 0, "oom_failures": 0, "nonfinite_sequences": 0,
            "spec_proposed_tokens": 0, "spec_accepted_tokens": 0, "spec_drafts": 0, **more}  # fmt: skip


def model_counts(hits: int, preemptions: int) -> dict[str, int]:
    """An engine model's counters: the engine's, and its replays."""
    return counts(hits, preemptions, replayed=0, resumed=0, poisoned=0)


def test_counters_add_the_counts_of_exited_engines():
    counters = EngineCounters()
    assert counters.totals(None) == counts(0, 0)
    assert counters.totals(stats(prefix_cache_hit_tokens=40, preemptions=2)) == counts(40, 2)
    counters.engine_exited(stats(prefix_cache_hit_tokens=48, preemptions=3))
    assert counters.totals(None) == counts(48, 3)
    # the restarted engine counts from zero
    assert counters.totals(stats(prefix_cache_hit_tokens=16, preemptions=0)) == counts(64, 3)
    counters.engine_exited(None)  # an engine that never reported
    assert counters.totals(stats(prefix_cache_hit_tokens=16)) == counts(64, 3)


def test_counters_never_go_backwards_even_when_an_exit_was_missed():
    counters = EngineCounters()
    assert counters.totals(stats(preemptions=5))["preemptions"] == 5
    assert counters.totals(stats(preemptions=1))["preemptions"] == 5
    assert counters.totals(stats(preemptions=7))["preemptions"] == 7


def test_engine_model_keeps_counting_across_a_restart():
    model = EngineModel(SimpleNamespace(model_name="m"))
    model._closing = True  # no restart task here: the test plays the new engine itself
    old = SimpleNamespace(stats=stats(prefix_cache_hit_tokens=32, preemptions=1, running=2), info={"kv_blocks": 100})
    model.client = old
    assert model.metrics_snapshot().counters == model_counts(32, 1)
    model._on_exit(old, "killed")
    gone = model.metrics_snapshot()
    assert gone.counters == model_counts(32, 1)
    assert (gone.running, gone.kv_blocks_used, gone.kv_blocks_total) == (0, 0, 100)
    model.client = SimpleNamespace(stats=stats(prefix_cache_hit_tokens=16), info={"kv_blocks": 100})
    assert model.metrics_snapshot().counters == model_counts(48, 1)


def test_step_counters_survive_a_restart():
    counters = EngineCounters()
    assert counters.totals(stats(graph_steps=90, eager_steps=10)) == counts(0, 0, 90, 10)
    counters.engine_exited(stats(graph_steps=95, eager_steps=12))
    assert counters.totals(stats(graph_steps=3, eager_steps=1)) == counts(0, 0, 98, 13)


def test_engine_snapshot_before_the_first_step():
    s = engine_snapshot(SimpleNamespace(stats=None, info={"kv_blocks": 64}), EngineCounters())
    assert (s.running, s.waiting, s.kv_blocks_used, s.kv_blocks_total) == (0, 0, 0, 64)
    assert engine_snapshot(None, EngineCounters()).kv_blocks_total == 0


def test_the_engines_own_endings_survive_a_restart():
    counters = EngineCounters()
    assert counters.totals(stats(expired_in_queue=2, oom_failures=1))["expired_in_queue"] == 2
    counters.engine_exited(stats(expired_in_queue=3, oom_failures=1, nonfinite_sequences=4))
    totals = counters.totals(stats(expired_in_queue=1))
    assert (totals["expired_in_queue"], totals["oom_failures"], totals["nonfinite_sequences"]) == (4, 1, 4)
