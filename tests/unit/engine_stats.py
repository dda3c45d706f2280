"""Engine statistics as an engine reports them, for the metrics tests."""

from lmiserve import wire


def stats(**kw) -> wire.EngineStats:
    values = dict(
        running=0,
        waiting=0,
        kv_blocks_used=0,
        kv_blocks_total=100,
        prefix_cache_hit_tokens=0,
        preemptions=0,
        prompt_tokens=0,
        generated_tokens=0,
        step_seconds=0.0,
    )
    values.update(kw)
    return wire.EngineStats(**values)
