"""Driving a serial and an overlapped engine (option.async_scheduling) through the same requests."""

from __future__ import annotations

import pytest

from .engine_helpers import make_engine


def drive(engine, arrivals, abort_after=None, eos=None, max_steps=500):
    """Requests added at the given steps; a request in ``abort_after`` is aborted once it has that
    many tokens (as the output processor does on a stop string). Per sequence, its deltas."""
    if eos is not None:
        engine.outputs.eos_token_ids = tuple(eos)
    abort_after = abort_after or {}
    seen: dict[tuple[str, int], list[tuple]] = {}
    counts: dict[str, int] = {}
    for step in range(max_steps):
        for rid, prompt, params in arrivals.get(step, []):
            engine.add_request(rid, prompt, params)
        if not engine.has_work() and step > max(arrivals):
            break
        for d in engine.step():
            top = None if d.top_logprobs is None else [[(t.token_id, t.logprob) for t in row] for row in d.top_logprobs]
            record = (d.token_ids, d.logprobs, top, d.finish_reason, d.cumulative_logprob,
                      d.num_prompt_tokens, d.num_cached_tokens, d.prompt_logprobs, d.error)  # fmt: skip
            seen.setdefault((d.request_id, d.index), []).append(record)
            counts[d.request_id] = counts.get(d.request_id, 0) + len(d.token_ids)
        for rid, n in abort_after.items():
            if counts.get(rid, 0) >= n and rid in engine.groups:
                engine.abort(rid)
    assert not engine.has_work()
    assert engine.blocks.num_used_blocks == 0
    return seen


def both(model_dir, arrivals, serial_steps=0, **kwargs):
    """The deltas of a serial and an overlapped engine; ``serial_steps``: how many steps the
    overlapped engine must run serially (None: some)."""
    options = kwargs.pop("options", {})
    serial = drive(make_engine(model_dir, async_scheduling="false", **options), arrivals, **kwargs)
    engine = make_engine(model_dir, async_scheduling="true", **options)
    assert engine.overlap is not None
    overlapped = drive(engine, arrivals, **kwargs)
    assert engine.overlap.overlapped > 0
    assert engine.overlap.serial > 0 if serial_steps is None else engine.overlap.serial == serial_steps
    return serial, overlapped


def same(serial, overlapped, exact):
    """Equal deltas; unless ``exact``, log-probabilities to float32 rounding (the batches differ:
    an overlapped step also runs the sequences that ended in the step before it)."""
    if exact:
        return overlapped == serial
    loose = lambda seen: {k: [(r[0], r[3], r[5], r[6], r[8]) for r in v] for k, v in seen.items()}  # noqa: E731
    floats = lambda seen: [x for v in seen.values() for r in v for x in (*r[1], r[4])]  # noqa: E731
    return loose(overlapped) == loose(serial) and floats(overlapped) == pytest.approx(floats(serial), rel=1e-5)
